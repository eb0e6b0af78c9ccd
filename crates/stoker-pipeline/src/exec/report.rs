//! What a run reports about its plan: [`Run::explain`], the plan it runs with the
//! optimizer's reasons, next to what its operators measured (`Stats::operators`) and the plan
//! the optimizer would make from those measurements where it differs.

use super::Run;

impl Run {
    /// The plan this run runs, with the optimizer's reasons (as [`Pipeline::explain`], with
    /// the format the run listed), then what each operator measured so far next to what it
    /// declared (time and bytes a sample, one sample in eight), and what the optimizer's
    /// measurement-driven decisions would be with these numbers where they differ from the
    /// declarations it planned with.
    pub fn explain(&self) -> String {
        let (p, facts) = &self.planned;
        let mut s = crate::optimize::explain_with(p, facts);
        // Operators that chose where to run from their first calls.
        for op in &p.ops {
            if let Some(why) = match op {
                crate::plan::Op::Map(m) => m.placement(),
                _ => None,
            } {
                s.push_str(&format!("placed while running: {why}\n"));
            }
        }
        let st = self.stats();
        if st.operators.iter().all(|o| o.samples == 0) {
            s.push_str(
                "measured: nothing yet
",
            );
            return s;
        }
        s.push_str(
            "measured (one sample in 8):
",
        );
        let kb = |b: Option<f64>| b.map_or("?".into(), |b| format!("{:.1} KB", b / 1000.0));
        let ratio = |r: Option<f64>| r.map_or("none".into(), |r| format!("x{r:.2}"));
        let ms = |n: Option<f64>| n.map_or("none".into(), |n| format!("{:.3} ms", n / 1e6));
        for o in &st.operators {
            if o.samples == 0 {
                s.push_str(&format!(
                    "  {}: not measured yet
",
                    o.name
                ));
                continue;
            }
            s.push_str(&format!(
                "  {}: {} a sample (declared {}), {} -> {} ({}; declared {}), {} samples\n",
                o.name,
                ms(o.ns_per_sample),
                ms(o.hint_ns),
                kb(o.bytes_in_per_sample),
                kb(o.bytes_out_per_sample),
                ratio(o.size_ratio),
                ratio(o.hint_size_ratio),
                o.samples
            ));
        }
        // A cache whose size was measured as it filled: what it found.
        if let Some((c, projected)) = st
            .sample_cache
            .as_ref()
            .and_then(|c| Some((c, c.projected?)))
        {
            let limit = c.limit.map_or("?".into(), crate::ops::size);
            s.push_str(&format!(
                "cache of samples, measured as it filled: an epoch's samples there come to {}, \
                 {}\n",
                crate::ops::size(projected),
                if c.dropped {
                    format!("over its limit of {limit}: dropped, every epoch makes them")
                } else {
                    format!("within its limit of {limit}: kept")
                },
            ));
        }
        // The decisions that depend on measured sizes, made again with them.
        let mut measured = facts.clone();
        for o in &st.operators {
            // A fused kernel stands for several operators of the plan: no one ratio each.
            if let (Some(r), false) = (o.size_ratio, o.name.contains('+')) {
                measured.measured_ratio.insert(o.index, r);
            }
        }
        let again = crate::optimize::explain_with(p, &measured);
        // The physical plan (the stages) of an explanation.
        let stages = |text: &str| -> Vec<String> {
            text.lines()
                .skip_while(|l| *l != "physical:")
                .take_while(|l| !l.starts_with("  because: "))
                .map(str::to_string)
                .collect()
        };
        if stages(&again) != stages(&s) {
            s.push_str("with these measurements the plan would be (a run planned from them):\n");
            for l in stages(&again).iter().skip(1) {
                s.push_str(&format!("{l}\n"));
            }
            for l in again
                .lines()
                .filter(|l| l.starts_with("  because: moved shuffle"))
            {
                s.push_str(&format!("{l}\n"));
            }
            if !again.contains("moved shuffle") {
                s.push_str(
                    "  because: the measured sizes leave each shuffle where it was written\n",
                );
            }
        }
        s
    }
}
