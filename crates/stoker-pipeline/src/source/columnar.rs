//! The columnar path: a format that decodes columns (Parquet) read straight into the first
//! batch. A reader thread per shard decodes row groups ahead (bounded in bytes,
//! [`AheadGate`]); the structural operators (rename, select, drop) run once per chunk on its
//! names ([`restructure`]); [`run_columnar`] cuts the columns into batches of the batch
//! stage's size across row groups and files, with the row path's positions and errors (see
//! the choice in `optimize::read_path`).

use std::sync::Arc;

use stoker_core::{Columns, Error, Sample};

use super::{open_input, Columnar, Dataset, Pos, Produced, SourceCursor};
use crate::ops::{checked, OpContext, SampleOp};
use crate::split::Piece;

pub(super) enum ColumnMsg {
    Rows(Columns),
    Err(Error),
    End,
}

/// Decoded bytes a columnar shard reader may hold ahead of the source: enough for a few
/// row groups of a narrow table (so the next row group is fetched while this one is cut),
/// a bound for wide ones (at least one chunk always goes).
pub(super) const COLUMNS_AHEAD_BYTES: u64 = 8 << 20;

/// The decoded bytes a shard reader has sent and the source not yet taken.
#[derive(Default)]
pub(super) struct AheadGate {
    pub(super) bytes: parking_lot::Mutex<u64>,
    pub(super) moved: parking_lot::Condvar,
    pub(super) closed: std::sync::atomic::AtomicBool,
}

impl AheadGate {
    /// Waits until `n` more bytes fit (false once the source is gone).
    pub(super) fn admit(&self, n: u64) -> bool {
        let mut b = self.bytes.lock();
        while *b > 0 && *b + n > COLUMNS_AHEAD_BYTES {
            if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
                return false;
            }
            self.moved
                .wait_for(&mut b, std::time::Duration::from_millis(50));
        }
        *b += n;
        true
    }

    pub(super) fn release(&self, n: u64) {
        let mut b = self.bytes.lock();
        *b = b.saturating_sub(n);
        self.moved.notify_all();
    }
}

/// A shard being read as columns: the reader thread's messages and its gate.
pub(super) struct ColumnShard {
    pub(super) rx: crossbeam_channel::Receiver<ColumnMsg>,
    pub(super) gate: Arc<AheadGate>,
}

impl ColumnShard {
    pub(super) fn recv(&self) -> ColumnMsg {
        let m = self.rx.recv().unwrap_or(ColumnMsg::End);
        if let ColumnMsg::Rows(c) = &m {
            self.gate.release(c.size_bytes() as u64);
        }
        m
    }
}

impl Drop for ColumnShard {
    fn drop(&mut self) {
        self.gate
            .closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.gate.moved.notify_all();
    }
}

/// Reads shard `id` as columns on its own thread, after skipping `skip` records (rows or
/// errors, as the row reader counts them), up to [`COLUMNS_AHEAD_BYTES`] ahead.
pub(super) fn spawn_column_reader(ds: &Arc<Dataset>, id: u32, skip: u64) -> ColumnShard {
    let (tx, rx) = crossbeam_channel::unbounded();
    let gate = Arc::new(AheadGate::default());
    let ds = ds.clone();
    let g = gate.clone();
    std::thread::Builder::new()
        .name("stoker-shard".into())
        .spawn(move || {
            let shard = &ds.shards[id as usize];
            let reader = open_input(&ds, id).and_then(|input| ds.format.open_columns(shard, input));
            let mut reader = match reader {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(ColumnMsg::Err(e.with_object(shard.url.clone())));
                    let _ = tx.send(ColumnMsg::End);
                    return;
                }
            };
            // Records before the checkpoint were delivered (or reported) already.
            let mut left = skip;
            while left > 0 {
                match reader.next_columns(left.min(usize::MAX as u64) as usize) {
                    Ok(Some(c)) => left -= (c.len() as u64).min(left),
                    Ok(None) => break,
                    Err(_) => left -= 1,
                }
            }
            loop {
                let msg = match reader.next_columns(usize::MAX) {
                    Ok(Some(c)) => {
                        if !g.admit(c.size_bytes() as u64) {
                            return;
                        }
                        ColumnMsg::Rows(c)
                    }
                    Ok(None) => ColumnMsg::End,
                    Err(e) => ColumnMsg::Err(e.with_object(shard.url.clone())),
                };
                let end = matches!(msg, ColumnMsg::End);
                if tx.send(msg).is_err() || end {
                    return;
                }
            }
        })
        .expect("spawn shard reader");
    ColumnShard { rx, gate }
}

/// A chunk after the structural operators. They only move names, so they run once, on a
/// sample whose values are the column indices: the result tells which column each output
/// field holds, or gives the error every row of the chunk would give (with the stage).
pub(super) fn restructure(
    c: Columns,
    ops: &[(usize, Arc<dyn SampleOp>)],
) -> Result<Columns, Error> {
    if ops.is_empty() {
        return Ok(c);
    }
    let mut probe = Sample::with_capacity(c.names.len());
    for (k, n) in c.names.iter().enumerate() {
        probe.insert(n.clone(), k as i64);
    }
    for (i, op) in ops {
        let mut ctx = OpContext::new(0, 0, 0, 0, *i);
        let r = op.apply(probe, &mut ctx);
        // The structural operators are maps (`read_path` admits no filter here).
        probe = checked(&**op, r, "sample")?.ok_or_else(|| {
            Error::invalid("a filter cannot run on the columnar path").with_stage(op.meta().name)
        })?;
    }
    let mut cols: Vec<Option<stoker_core::Column>> = c.columns.into_iter().map(Some).collect();
    let mut names = Vec::with_capacity(probe.len());
    let mut columns = Vec::with_capacity(probe.len());
    for (name, v) in probe.iter() {
        let k = v.as_int().expect("a column index") as usize;
        names.push(name.clone());
        columns.push(cols[k].take().expect("each column once"));
    }
    Columns::new(names, columns)
}

/// Shards the columnar path opens ahead of the one it consumes.
pub(super) const SHARDS_AHEAD: usize = 3;

/// The columnar path (see the module docs): one shard at a time, rows cut into batches of
/// `col.size` across shard boundaries.
/// The columnar path over `pieces` (see [`run_shards`] for `counts`).
pub(super) fn run_columnar(
    ds: &Arc<Dataset>,
    col: &Columnar,
    pieces: &[Piece],
    counts: Option<&[u64]>,
    cursor: &mut SourceCursor,
    emit: &mut dyn FnMut(Produced, &SourceCursor) -> bool,
) {
    struct Open {
        order_index: u64,
        consumed: u64,
        /// The last chunk went past the piece's counted end.
        overflow: bool,
        rx: ColumnShard,
    }
    let order = pieces;
    let open = |i: u64, skip: u64| {
        let skip = skip.max(pieces[i as usize].start);
        Open {
            order_index: i,
            consumed: skip,
            overflow: false,
            rx: spawn_column_reader(ds, pieces[i as usize].shard, skip),
        }
    };
    let url = |shard: u32| ds.shards[shard as usize].url.clone();
    // The next shards are opened ahead (their footers and first row groups fetched while
    // this one is cut into batches); the cursor counts only the shard being consumed.
    let mut ahead: std::collections::VecDeque<Open> = std::collections::VecDeque::new();
    let fill_ahead = |ahead: &mut std::collections::VecDeque<Open>, next: u64| {
        let mut j = next + ahead.len() as u64;
        while ahead.len() < SHARDS_AHEAD && (j as usize) < order.len() {
            ahead.push_back(open(j, 0));
            j += 1;
        }
    };
    let mut slot = if cursor.slots.is_empty() && cursor.next == 0 {
        (!order.is_empty()).then(|| {
            cursor.next = 1;
            open(0, 0)
        })
    } else {
        cursor.slots.first().map(|&(i, c)| open(i, c))
    };
    let mut send = |cursor: &mut SourceCursor, slot: &Option<Open>, mut p: Produced| -> bool {
        cursor.slots = slot.iter().map(|s| (s.order_index, s.consumed)).collect();
        cursor.rr = 0;
        p.set_seq(cursor.emitted);
        cursor.emitted += 1;
        emit(p, cursor)
    };
    fill_ahead(&mut ahead, cursor.next);
    // The batch being filled.
    let mut parts: Vec<Columns> = Vec::new();
    let mut positions: Vec<Pos> = Vec::with_capacity(col.size);
    let mut rows = 0usize;
    let batch = |parts: &mut Vec<Columns>, positions: &mut Vec<Pos>| Produced::Rows {
        seq: 0,
        positions: std::mem::replace(positions, Vec::with_capacity(col.size)),
        parts: std::mem::take(parts),
        collate: col.collate.clone(),
        hold: None,
    };
    while let Some(s) = slot.as_mut() {
        let piece = pieces[s.order_index as usize];
        let shard = piece.shard;
        let counted = counts.map(|c| c[shard as usize]);
        // The piece ends where the shard's count does, and that has not been checked yet
        // (a position past the end means it was, and reported: see `run_shards`).
        let ends_shard =
            counted.is_some() && piece.end == counted && piece.end.is_some_and(|e| s.consumed <= e);
        let at_end = piece.end.is_some_and(|e| s.consumed >= e);
        let msg = if at_end && !ends_shard {
            // The piece is read; the rest of the shard is another rank's (or part's).
            ColumnMsg::End
        } else if at_end && s.overflow {
            // Rows past the count came with the last chunk (the error is made below).
            ColumnMsg::Err(Error::record("rows past the count"))
        } else {
            s.rx.recv()
        };
        let msg = match (msg, counted, piece.end) {
            // Counts are promises, checked as in `run_shards`.
            (ColumnMsg::End, Some(n), Some(e)) if ends_shard && !at_end => {
                let got = s.consumed;
                s.consumed = e;
                ColumnMsg::Err(crate::split::ended_early(url(shard), got, n))
            }
            (ColumnMsg::Rows(_) | ColumnMsg::Err(_), Some(n), Some(_)) if ends_shard && at_end => {
                let got = s.consumed;
                // The error arm below counts it as one record: the position then lies past
                // the end, which marks the check as made.
                s.consumed = n;
                s.overflow = false;
                ColumnMsg::Err(crate::split::goes_on(url(shard), got, n))
            }
            (ColumnMsg::Rows(mut c), _, Some(e)) if s.consumed + c.len() as u64 > e => {
                // Only the piece's rows; with the shard's count, what follows is an error.
                s.overflow = ends_shard;
                ColumnMsg::Rows(c.take_front((e - s.consumed) as usize))
            }
            (m, _, _) => m,
        };
        match msg {
            ColumnMsg::Rows(c) => {
                let n = c.len();
                let mut c = match restructure(c, &col.ops) {
                    Ok(c) => c,
                    Err(error) => {
                        // Every row fails, as it would on the workers.
                        for _ in 0..n {
                            let s = slot.as_mut().expect("open");
                            let pos = Pos {
                                shard,
                                record: s.consumed,
                            };
                            s.consumed += 1;
                            cursor.stream_index += 1;
                            let error = error.clone();
                            if !send(cursor, &slot, Produced::Fail { seq: 0, pos, error }) {
                                return;
                            }
                        }
                        continue;
                    }
                };
                while !c.is_empty() {
                    let s = slot.as_mut().expect("open");
                    let n = c.len().min(col.size - rows);
                    let part = c.take_front(n);
                    positions.extend((0..n as u64).map(|k| Pos {
                        shard,
                        record: s.consumed + k,
                    }));
                    s.consumed += n as u64;
                    cursor.stream_index += n as u64;
                    rows += n;
                    parts.push(part);
                    if rows == col.size {
                        rows = 0;
                        let p = batch(&mut parts, &mut positions);
                        if !send(cursor, &slot, p) {
                            return;
                        }
                    }
                }
            }
            ColumnMsg::Err(error) => {
                let pos = Pos {
                    shard,
                    record: s.consumed,
                };
                s.consumed += 1;
                if !send(cursor, &slot, Produced::Fail { seq: 0, pos, error }) {
                    return;
                }
            }
            ColumnMsg::End => {
                slot = ((cursor.next as usize) < order.len()).then(|| {
                    cursor.next += 1;
                    match ahead.pop_front() {
                        Some(o) => {
                            debug_assert_eq!(o.order_index, cursor.next - 1);
                            o
                        }
                        None => open(cursor.next - 1, 0),
                    }
                });
            }
        }
        fill_ahead(&mut ahead, cursor.next);
    }
    if rows > 0 && !col.drop_last {
        let p = batch(&mut parts, &mut positions);
        send(cursor, &slot, p);
    }
}
