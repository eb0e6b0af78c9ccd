//! `stoker ls` and `stoker cat`.
//!
//! `stoker ls` lists what every other consumer of the store sees (pipelines, `stoker.io.ls`,
//! the mount): keys that cannot be file names (control characters, `.`, `..`, empty
//! segments) are left out, and the store names them, escaped, in one warning on stderr.
//! Keys are printed through [`escape_key`] (a key cannot move the cursor or recolour the
//! terminal; a backslash shows as `\\`); `--json` prints them exactly, JSON-escaped.

use std::io::Write;

use anyhow::Context;
use futures::StreamExt;
use stoker_store::{escape_key, ListOptions, Store};

use crate::args::{CatArgs, LsArgs};

pub async fn ls(a: LsArgs) -> anyhow::Result<()> {
    let store = Store::open(&a.url, a.store.options()?)?;
    let prefix = store.url_key().to_string();
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let print = |out: &mut dyn Write, o: &stoker_store::ObjectInfo| -> std::io::Result<()> {
        if a.json {
            writeln!(out, "{}", serde_json::to_string(o).expect("serialisable"))
        } else if a.long {
            writeln!(
                out,
                "{:>14}  {:<36}  {}",
                o.size,
                escape_key(o.etag.as_deref().unwrap_or("-")),
                escape_key(&o.key)
            )
        } else {
            writeln!(out, "{}", escape_key(&o.key))
        }
    };
    if a.recursive || a.glob.is_some() {
        let mut opts = ListOptions::default();
        if let Some(g) = &a.glob {
            opts = opts.with_glob(g);
        }
        let all = store.list_all(&prefix, &opts).await?;
        if all.is_empty() {
            // Maybe the URL names one object.
            if let Ok(info) = store.head(&prefix).await {
                print(&mut out, &info)?;
                return Ok(out.flush()?);
            }
        }
        for o in &all {
            print(&mut out, o)?;
        }
    } else {
        let level = store.list_dir(&prefix).await?;
        if level.objects.is_empty() && level.prefixes.is_empty() {
            if let Ok(info) = store.head(&prefix).await {
                print(&mut out, &info)?;
                return Ok(out.flush()?);
            }
        }
        for p in &level.prefixes {
            if a.json {
                writeln!(out, "{}", serde_json::json!({ "prefix": p }))?;
            } else if a.long {
                writeln!(out, "{:>14}  {:<36}  {}", "PRE", "", escape_key(p))?;
            } else {
                writeln!(out, "{}", escape_key(p))?;
            }
        }
        for o in &level.objects {
            print(&mut out, o)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Parses `A-B` (B exclusive), `A-` or `-N` (last N bytes) against an object of `size`.
pub fn parse_range(spec: &str, size: u64) -> anyhow::Result<std::ops::Range<u64>> {
    let (a, b) = spec
        .split_once('-')
        .with_context(|| format!("range {spec:?} must look like START-END, START- or -LEN"))?;
    let num = |s: &str| -> anyhow::Result<u64> {
        s.trim()
            .parse::<stoker_core::ByteSize>()
            .map(|b| b.bytes())
            .map_err(|e| anyhow::anyhow!("range {spec:?}: {e}"))
    };
    Ok(match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, false) => size.saturating_sub(num(b)?)..size,
        (false, true) => num(a)?..size,
        (false, false) => num(a)?..num(b)?,
        (true, true) => anyhow::bail!("range {spec:?} is empty"),
    })
}

pub async fn cat(a: CatArgs) -> anyhow::Result<()> {
    let store = Store::open(&a.url, a.store.options()?)?;
    let key = store.url_key().to_string();
    let info = store.head(&key).await?;
    let range = match &a.range {
        Some(spec) => parse_range(spec, info.size)?,
        None => 0..info.size,
    };
    let mut parts = store.read_stream(&key, Some(range)).await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while let Some(part) = parts.next().await {
        out.write_all(&part?)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("0-10", 100).unwrap(), 0..10);
        assert_eq!(parse_range("90-", 100).unwrap(), 90..100);
        assert_eq!(parse_range("-5", 100).unwrap(), 95..100);
        assert_eq!(parse_range("1KiB-2KiB", 4096).unwrap(), 1024..2048);
        assert!(parse_range("x", 100).is_err());
    }
}
