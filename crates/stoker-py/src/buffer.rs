//! Zero-copy hand-over of Stoker's bytes to Python.
//!
//! A [`Buffer`] owns one `bytes::Bytes` (a reference to memory the engine filled: a fetched
//! object, a slice of a tar shard, a stacked batch) and exports it through the buffer
//! protocol as read-only unsigned bytes. Python then sees:
//!
//! - a bytes field as `memoryview(buffer)`: `view.obj` is the [`Buffer`];
//! - a tensor as `numpy.ndarray(shape, dtype, buffer=buffer)`: NumPy keeps the [`Buffer`]
//!   as the array's `base`, and the array is read-only.
//!
//! Neither copies: the memory stays valid as long as any view or array over it lives,
//! because each holds a reference to the [`Buffer`], which holds the `Bytes`. That also
//! means a small view keeps its whole underlying allocation alive (a field sliced out of a
//! tar shard keeps the shard's fetch), outside the pipeline's memory budget once the
//! consumer has taken the item; copy (`bytes(view)`, `array.copy()`) to let it go.
//!
//! The buffer protocol is part of the stable ABI from Python 3.11, hence `abi3-py311`.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use std::sync::Arc;

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyMemoryView, PyTuple};
use stoker_core::{DType, Tensor};

use crate::dlpack;

/// Read-only bytes owned by Stoker, shared with Python without a copy.
#[pyclass(frozen, module = "stoker._native")]
pub struct Buffer {
    /// The bytes. DLPack exports share the `Arc`, not the `Bytes`, so that the `Bytes`'
    /// own reference count still says whether anything besides this buffer (the cache,
    /// other samples) holds the memory.
    data: Arc<Owned>,
    /// The one-dimensional shape, `[len]`, pointed to by exported views.
    shape: [ffi::Py_ssize_t; 1],
    /// The one stride, `[1]`, pointed to by exported views.
    strides: [ffi::Py_ssize_t; 1],
    /// The tensor the bytes are, if they are one (its dtype and shape): what DLPack
    /// exports. Plain bytes export as a one-dimensional `uint8` tensor.
    tensor: Option<(DType, Vec<usize>)>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({} bytes at {:p})",
            self.data.len(),
            self.data.as_ptr()
        )
    }
}

/// The bytes a [`Buffer`] and its DLPack exports share. When the last of them lets go of a
/// large allocation that nothing else references (a stacked batch whose array or tensor was
/// collected), the allocation goes back to the engine's batch recycler
/// ([`stoker_core::recycle`]) for a later batch, instead of to the allocator: glibc unmaps
/// blocks that large, and the next batch would fault every page in again.
pub(crate) struct Owned(Bytes);

impl std::ops::Deref for Owned {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.0
    }
}

impl Owned {
    pub(crate) fn new(data: Bytes) -> Owned {
        Owned(data)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.0);
        if data.len() >= stoker_core::recycle::MIN_SIZE {
            if let Ok(mut whole) = data.try_into_mut() {
                // Emptied first: the conversion to a `Vec` then moves no bytes.
                whole.clear();
                stoker_core::recycle::GLOBAL.put(Vec::from(whole));
            }
        }
    }
}

impl Buffer {
    pub(crate) fn new(data: Bytes) -> Buffer {
        let len = data.len() as ffi::Py_ssize_t;
        Buffer {
            data: Arc::new(Owned(data)),
            shape: [len],
            strides: [1],
            tensor: None,
        }
    }

    /// A buffer holding tensor `t`'s memory (the same bytes; DLPack exports the tensor).
    pub(crate) fn of_tensor(t: &Tensor) -> Buffer {
        Buffer {
            tensor: Some((t.dtype(), t.shape().to_vec())),
            ..Buffer::new(t.data().clone())
        }
    }

    /// The engine's bytes (a new reference to them, no copy).
    pub(crate) fn bytes(&self) -> Bytes {
        Bytes::clone(&self.data)
    }

    fn dtype_and_shape(&self) -> (DType, Vec<usize>) {
        match &self.tensor {
            Some((d, s)) => (*d, s.clone()),
            None => (DType::U8, vec![self.data.len()]),
        }
    }
}

#[pymethods]
impl Buffer {
    /// # Safety
    /// Called by the interpreter with a valid `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no Py_buffer to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "Stoker's buffers are read-only (copy them to write)",
            ));
        }
        let this = slf.get();
        // SAFETY: `view` is a valid, writable Py_buffer (checked non-null above). The
        // pointers stored in it point into `this`, which the view keeps alive through
        // `obj` (a new reference); the data pointer is the `Bytes`' and never moves.
        unsafe {
            (*view).buf = this.data.as_ptr() as *mut c_void;
            (*view).len = this.shape[0];
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                this.shape.as_ptr() as *mut _
            } else {
                null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                this.strides.as_ptr() as *mut _
            } else {
                null_mut()
            };
            (*view).suboffsets = null_mut();
            (*view).internal = null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    /// Nothing to release: the format, shape and strides live in the object itself.
    ///
    /// # Safety
    /// Called by the interpreter with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// The address of the first byte (to check that arrays share this memory).
    #[getter]
    fn address(&self) -> usize {
        self.data.as_ptr() as usize
    }

    /// The dtype DLPack exports (`"uint8"` for plain bytes; `"bfloat16"` for bfloat16
    /// tensors, which NumPy sees as `uint16`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype_and_shape().0.name()
    }

    /// The shape DLPack exports (`(len,)` for plain bytes).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.dtype_and_shape().1)
    }

    /// Whether this buffer is the only reference to its memory (a batch the engine just
    /// stacked), so that writing to it cannot change anything else; DLPack marks other
    /// memory read-only.
    #[getter]
    fn exclusive(&self) -> bool {
        self.data.is_unique()
    }

    /// The number of DLPack exports of this buffer still alive (consumed or not).
    #[getter]
    fn exports(&self) -> usize {
        Arc::strong_count(&self.data) - 1
    }

    /// DLPack export (see `dlpack`): a capsule over this memory, without a copy unless
    /// `copy=True`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let req = dlpack::request(stream, max_version, dl_device, copy)?;
        let (dtype, shape) = self.dtype_and_shape();
        dlpack::export(py, &self.data, dtype, &shape, req)
    }

    /// `(kDLCPU, 0)`: the memory is the CPU's.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> String {
        let (dtype, shape) = self.dtype_and_shape();
        format!(
            "<stoker Buffer of {} bytes at {:#x}: {} {:?}>",
            self.data.len(),
            self.data.as_ptr() as usize,
            dtype.name(),
            shape
        )
    }
}

/// A read-only `memoryview` of `data`, without a copy.
pub(crate) fn memoryview<'py>(py: Python<'py>, data: Bytes) -> PyResult<Bound<'py, PyAny>> {
    let owner = Bound::new(py, Buffer::new(data))?;
    Ok(PyMemoryView::from(owner.as_any())?.into_any())
}

/// The NumPy type string of a dtype. NumPy has no bfloat16: those come as their raw 16-bit
/// words (`uint16`).
fn numpy_dtype(d: DType) -> &'static str {
    match d {
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
    }
}

static NDARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static EMPTY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A read-only NumPy array over the tensor's memory, without a copy (an empty tensor gets a
/// new empty array: there is no memory to share).
pub(crate) fn ndarray<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let dtype = numpy_dtype(t.dtype());
    let shape = PyTuple::new(py, t.shape())?;
    if t.data().is_empty() {
        let empty = EMPTY.import(py, "numpy", "empty")?;
        return empty.call1((shape, dtype));
    }
    // `ndarray(shape, dtype, buffer=owner)` makes `owner` the array's base (a reshape of
    // `frombuffer` would make the base another array).
    let ndarray = NDARRAY.import(py, "numpy", "ndarray")?;
    let owner = Bound::new(py, Buffer::of_tensor(t))?;
    ndarray.call1((shape, dtype, owner))
}
