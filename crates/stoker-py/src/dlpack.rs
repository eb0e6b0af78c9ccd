//! DLPack export of a [`crate::buffer::Buffer`]: `__dlpack__` / `__dlpack_device__`, so
//! `torch.from_dlpack`, `jax.dlpack.from_dlpack` and every array library that speaks the
//! protocol take Stoker's memory without a copy.
//!
//! The structs below are DLPack 1.0's C ABI (`dlpack.h`), written out from the
//! specification. A consumer asking for `max_version >= (1, 0)` gets a versioned capsule
//! (`"dltensor_versioned"`, a `DLManagedTensorVersioned`) that can say the memory is
//! read-only; an older consumer gets the legacy capsule (`"dltensor"`, a
//! `DLManagedTensor`), which cannot, so shared memory is refused to it unless it asks for a
//! copy (NumPy's rule for read-only arrays).
//!
//! **Ownership.** Each export boxes a small holder: the managed tensor struct (first field,
//! so the struct's address is the box's), a reference to the buffer's bytes (an `Arc`
//! clone, not a copy), and the shape and strides the struct points to. The consumer calls
//! the struct's deleter when its tensor dies, which drops the holder and so the reference;
//! that needs no GIL (an `Arc` of the bytes is thread-safe), which matters because torch frees
//! tensors on any thread. A capsule nobody consumed still holds its original name when Python
//! destroys it, and its destructor then calls the deleter itself; a consumed capsule is
//! renamed `used_...` by the consumer, and the destructor leaves it alone.
//!
//! **Read-only.** The memory is marked read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`) unless
//! the buffer's `Bytes` is the only reference to its allocation ([`Bytes::is_unique`]), as
//! for a batch the engine just stacked: then no other sample, cache entry or mapped file can
//! see a write. Memory shared with the store's cache, a tar shard's other members or a
//! mapped disk-cache file is always read-only. Exports share the buffer's `Arc`, not its
//! `Bytes`, so they do not count: two tensors over one batch are both zero-copy views.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use bytes::Bytes;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use stoker_core::DType;

use crate::buffer::Owned;

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 1 << 1;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What one export keeps alive. `managed` comes first so that a pointer to it is a pointer
/// to the holder.
#[repr(C)]
struct Holder<M> {
    managed: M,
    _data: Arc<Owned>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of a boxed `Holder` made by `export` and handed
        // out once; the consumer calls the deleter once.
        drop(unsafe { Box::from_raw(m as *mut Holder<DLManagedTensor>) });
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as in `delete_legacy`.
        drop(unsafe { Box::from_raw(m as *mut Holder<DLManagedTensorVersioned>) });
    }
}

/// Destructor of a capsule: deletes the tensor if no consumer took it (a consumer renames
/// the capsule, and then owns the tensor).
unsafe extern "C" fn capsule_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule (Python calls this from its deallocation);
    // `PyCapsule_IsValid` sets no exception, and the pointer is checked valid first.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME_LEGACY.as_ptr());
            delete_legacy(m as *mut DLManagedTensor);
        }
    }
}

unsafe extern "C" fn capsule_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr());
            delete_versioned(m as *mut DLManagedTensorVersioned);
        }
    }
}

/// DLPack's type of a dtype.
fn dl_dtype(d: DType) -> DLDataType {
    // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
    let code = match d {
        DType::U8 => 1,
        DType::I16 | DType::I32 | DType::I64 => 0,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
    };
    DLDataType {
        code,
        bits: (d.size() * 8) as u8,
        lanes: 1,
    }
}

/// Row-major strides, in elements, of `shape`.
fn strides_of(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

/// How a consumer asked for the tensor.
pub(crate) struct Request {
    /// DLPack 1.0 or later (a versioned capsule) rather than the legacy one.
    pub versioned: bool,
    /// `copy`: `Some(true)` always copies, `Some(false)` never, `None` when needed (never,
    /// except for a legacy consumer of shared memory, which is refused instead).
    pub copy: Option<bool>,
}

/// The request a `__dlpack__` call makes, checking its arguments.
pub(crate) fn request(
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Request> {
    if let Some(s) = stream {
        if !s.is_none() {
            return Err(PyValueError::new_err(
                "Stoker's buffers are in CPU memory: __dlpack__ takes stream=None",
            ));
        }
    }
    if let Some((ty, id)) = dl_device {
        if ty != DEVICE_CPU || id != 0 {
            return Err(PyBufferError::new_err(format!(
                "Stoker's buffers are in CPU memory and export only to the CPU (device \
                 (1, 0)), not to device ({ty}, {id}); move the tensor after importing it"
            )));
        }
    }
    Ok(Request {
        versioned: max_version.is_some_and(|(major, _)| major >= 1),
        copy,
    })
}

/// A DLPack capsule over `data`, a tensor of `dtype` and `shape`.
pub(crate) fn export(
    py: Python<'_>,
    data: &Arc<Owned>,
    dtype: DType,
    shape: &[usize],
    req: Request,
) -> PyResult<Py<PyAny>> {
    let shared = !data.is_unique();
    let copied = req.copy == Some(true);
    if shared && !copied && !req.versioned {
        return Err(PyBufferError::new_err(
            "this Stoker buffer shares its memory (with the cache or other samples), and a \
             legacy DLPack consumer cannot be told it is read-only: pass copy=True, or use \
             a consumer that supports DLPack 1.0 (max_version=(1, 0))",
        ));
    }
    let data = if copied {
        Arc::new(Owned::new(Bytes::copy_from_slice(data)))
    } else {
        Arc::clone(data)
    };
    let mut shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut strides = strides_of(&shape);
    let tensor = DLTensor {
        data: data.as_ptr() as *mut c_void,
        device: DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: dl_dtype(dtype),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    // SAFETY: the capsule owns the boxed holder (its pointer); the destructor frees it
    // unless a consumer took it, and then the consumer's deleter call does. The vectors'
    // buffers do not move when the vectors move into the box.
    let capsule = unsafe {
        if req.versioned {
            let mut flags = 0;
            if copied {
                flags |= FLAG_IS_COPIED;
            } else if shared {
                flags |= FLAG_READ_ONLY;
            }
            let holder = Box::into_raw(Box::new(Holder {
                managed: DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_versioned),
                    flags,
                    dl_tensor: tensor,
                },
                _data: data,
                _shape: shape,
                _strides: strides,
            }));
            (*holder).managed.manager_ctx = holder as *mut c_void;
            let cap = ffi::PyCapsule_New(
                holder as *mut c_void,
                NAME_VERSIONED.as_ptr(),
                Some(capsule_versioned),
            );
            if cap.is_null() {
                delete_versioned(holder as *mut DLManagedTensorVersioned);
            }
            cap
        } else {
            let holder = Box::into_raw(Box::new(Holder {
                managed: DLManagedTensor {
                    dl_tensor: tensor,
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_legacy),
                },
                _data: data,
                _shape: shape,
                _strides: strides,
            }));
            (*holder).managed.manager_ctx = holder as *mut c_void;
            let cap = ffi::PyCapsule_New(
                holder as *mut c_void,
                NAME_LEGACY.as_ptr(),
                Some(capsule_legacy),
            );
            if cap.is_null() {
                delete_legacy(holder as *mut DLManagedTensor);
            }
            cap
        }
    };
    // SAFETY: `capsule` is a new reference or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }.map(Bound::unbind)
}
