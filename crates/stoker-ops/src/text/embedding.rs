//! A frozen embedding table: token ids in, their rows out.
//!
//! The table is a 2-D `.npy` file (`[rows, dim]`, little-endian `float32` or `float16`, C
//! order), as `numpy.save` writes it. It is memory-mapped, not read: a 50,257 x 768 table
//! (150 MB) costs nothing to open, the pages a lookup touches come from the page cache, and
//! every process of a run (or of a machine) shares them. A lookup copies one row per id
//! into the output, `ids.shape + [dim]`, written in place in the batch's buffer when the
//! executor offers a slot (the lookup is then also the batch's collation: the rows land
//! where the batch has them, copied once).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use stoker_core::{DType, Error, Lease, Tensor};

use crate::image::convert::Sink;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Arc<Table>,
}

#[derive(Debug)]
struct Table {
    map: Mmap,
    /// Where the rows start in the file.
    offset: usize,
    rows: usize,
    dim: usize,
    dtype: DType,
    path: String,
}

impl Embedding {
    /// Opens the `.npy` table at `path` (its header is read and checked; its rows are
    /// mapped).
    pub fn from_npy(path: impl AsRef<Path>) -> Result<Embedding, Error> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let bad = |why: String| Error::invalid(format!("embedding: table {shown}: {why}"));
        let file = File::open(path).map_err(|e| bad(format!("cannot open it: {e}")))?;
        // SAFETY: the map is read-only; a table changed under a run is the user's to avoid,
        // as with any memory-mapped data set (the rows read would be the new bytes).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(format!("cannot map it: {e}")))?;
        let (offset, header) = npy_header(&map).map_err(bad)?;
        let (dtype, shape) = parse_header(&header).map_err(bad)?;
        let [rows, dim] = shape[..] else {
            return Err(bad(format!("shape {shape:?} is not 2-D ([rows, dim])")));
        };
        let need = rows
            .checked_mul(dim)
            .and_then(|n| n.checked_mul(dtype.size()))
            .and_then(|n| n.checked_add(offset));
        if need.is_none_or(|n| n > map.len()) {
            return Err(bad(format!(
                "{} bytes, too short for [{rows}, {dim}] {dtype} rows after its header",
                map.len()
            )));
        }
        if dim == 0 {
            return Err(bad("rows of dimension 0".into()));
        }
        Ok(Embedding {
            table: Arc::new(Table {
                map,
                offset,
                rows,
                dim,
                dtype,
                path: shown,
            }),
        })
    }

    /// Rows in the table (the vocabulary size).
    pub fn rows(&self) -> usize {
        self.table.rows
    }

    /// Each row's length.
    pub fn dim(&self) -> usize {
        self.table.dim
    }

    /// The rows' element type (and the output's).
    pub fn dtype(&self) -> DType {
        self.table.dtype
    }

    /// Output bytes of `n` ids.
    pub fn output_len(&self, n: usize) -> usize {
        n * self.table.dim * self.table.dtype.size()
    }

    /// The rows of `ids` (an `int32` or `int64` tensor of any shape), as a tensor of shape
    /// `ids.shape + [dim]`, written into `slot(len)`'s lease when it gives one of the
    /// output's length. An id outside the table is an error naming it and its place.
    pub fn lookup_into(
        &self,
        ids: &Tensor,
        slot: &mut dyn FnMut(usize) -> Option<Lease>,
    ) -> Result<Tensor, Error> {
        let t = &*self.table;
        let n = ids.numel();
        let row = t.dim * t.dtype.size();
        let len = n * row;
        let data = ids.data();
        let id_at: Box<dyn Fn(usize) -> i64> = match ids.dtype() {
            DType::I64 => Box::new(|k| {
                i64::from_le_bytes(data[k * 8..k * 8 + 8].try_into().expect("8 bytes"))
            }),
            DType::I32 => Box::new(|k| {
                i32::from_le_bytes(data[k * 4..k * 4 + 4].try_into().expect("4 bytes")) as i64
            }),
            other => {
                return Err(Error::operator(format!(
                    "embedding: ids are {other}, expected int32 or int64"
                )))
            }
        };
        // Checked before any row is copied: a bad id leaves no half-written slot behind.
        for k in 0..n {
            let id = id_at(k);
            if id < 0 || id as u64 >= t.rows as u64 {
                return Err(Error::operator(format!(
                    "embedding: id {id} (at {k} of {n}) is outside table {} of {} rows",
                    t.path, t.rows
                )));
            }
        }
        let rows = &t.map[t.offset..t.offset + t.rows * row];
        let mut sink = Sink::new(slot(len), len);
        let dst = sink.dst();
        for k in 0..n {
            let id = id_at(k) as usize;
            let src = &rows[id * row..(id + 1) * row];
            for (d, s) in dst[k * row..(k + 1) * row].iter_mut().zip(src) {
                d.write(*s);
            }
        }
        let mut shape = ids.shape().to_vec();
        shape.push(t.dim);
        // SAFETY: every one of the `n` rows of `dst` was written above.
        Tensor::new(t.dtype, shape, unsafe { sink.done() })
    }

    /// [`lookup_into`](Self::lookup_into) into a buffer of its own.
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor, Error> {
        self.lookup_into(ids, &mut |_| None)
    }
}

/// The header's text and where the data starts.
fn npy_header(b: &[u8]) -> Result<(usize, String), String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, start): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(format!(".npy version {v} is not 1, 2 or 3")),
    };
    let end = start
        .checked_add(len)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| "its header runs past the end of the file".to_string())?;
    let text =
        std::str::from_utf8(&b[start..end]).map_err(|_| "its header is not text".to_string())?;
    Ok((end, text.to_string()))
}

/// The element type and shape a header names (C order only).
fn parse_header(h: &str) -> Result<(DType, Vec<usize>), String> {
    let value = |key: &str| -> Result<&str, String> {
        let at = h
            .find(&format!("'{key}'"))
            .ok_or_else(|| format!("its header has no '{key}'"))?;
        let rest = &h[at + key.len() + 2..];
        let colon = rest
            .find(':')
            .ok_or_else(|| format!("its header's '{key}' has no value"))?;
        Ok(rest[colon + 1..].trim_start())
    };
    let descr = value("descr")?;
    let dtype = if descr.starts_with("'<f4'") {
        DType::F32
    } else if descr.starts_with("'<f2'") {
        DType::F16
    } else {
        let shown: String = descr.chars().take_while(|c| *c != ',').collect();
        return Err(format!(
            "dtype {shown} is not little-endian float32 ('<f4') or float16 ('<f2')"
        ));
    };
    if !value("fortran_order")?.starts_with("False") {
        return Err("it is in Fortran order; save it in C order".into());
    }
    let shape = value("shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| "its header's shape is not a tuple".to_string())?;
    let dims = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("shape entry {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((dtype, dims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A `.npy` file as numpy 1.x writes one (version 1.0, header padded to 64 bytes).
    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        npy_in(descr, "False", shape, data)
    }

    fn npy_in(descr: &str, order: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((h.len() as u16).to_le_bytes());
        out.extend(h.as_bytes());
        out.extend(data);
        out
    }

    fn table(rows: usize, dim: usize) -> (tempfile::TempDir, std::path::PathBuf) {
        let data: Vec<u8> = (0..rows * dim)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.npy");
        std::fs::write(&p, npy("<f4", &format!("({rows}, {dim})"), &data)).unwrap();
        (dir, p)
    }

    fn ids(v: &[i64], shape: Vec<usize>) -> Tensor {
        let b: Vec<u8> = v.iter().flat_map(|i| i.to_le_bytes()).collect();
        Tensor::new(DType::I64, shape, Bytes::from(b)).unwrap()
    }

    #[test]
    fn rows_of_ids_of_any_shape() {
        let (_d, p) = table(5, 3);
        let e = Embedding::from_npy(&p).unwrap();
        assert_eq!((e.rows(), e.dim(), e.dtype()), (5, 3, DType::F32));
        let out = e.lookup(&ids(&[4, 0, 2, 2], vec![2, 2])).unwrap();
        assert_eq!(out.shape(), &[2, 2, 3]);
        let f: Vec<f32> = out
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            f,
            [12., 13., 14., 0., 1., 2., 6., 7., 8., 6., 7., 8.].to_vec()
        );
    }

    #[test]
    fn an_id_outside_the_table_and_bad_files_are_named() {
        let (_d, p) = table(5, 3);
        let e = Embedding::from_npy(&p).unwrap();
        let err = e.lookup(&ids(&[1, 5], vec![2])).unwrap_err().to_string();
        assert!(err.contains("id 5 (at 1 of 2) is outside table"), "{err}");
        assert!(err.contains("of 5 rows"), "{err}");
        let err = e.lookup(&ids(&[-1], vec![1])).unwrap_err().to_string();
        assert!(err.contains("id -1"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let bad = |name: &str, bytes: Vec<u8>, want: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let err = Embedding::from_npy(&p).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains(name), "{err}");
        };
        bad("text.npy", b"hello world".to_vec(), "no \\x93NUMPY magic");
        bad("f8.npy", npy("<f8", "(2, 2)", &[0; 32]), "'<f8' is not");
        bad("1d.npy", npy("<f4", "(4,)", &[0; 16]), "is not 2-D");
        bad("short.npy", npy("<f4", "(4, 4)", &[0; 16]), "too short");
        bad(
            "f.npy",
            npy_in("<f4", "True", "(2, 2)", &[0; 16]),
            "Fortran order",
        );
        assert!(Embedding::from_npy(dir.path().join("none.npy")).is_err());
    }
}
