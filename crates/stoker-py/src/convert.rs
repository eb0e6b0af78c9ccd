//! Samples between Stoker and Python.
//!
//! Out (engine to Python), a sample or a batch is a `dict` of its fields in order:
//!
//! | `Value` | Python |
//! |---|---|
//! | `Bytes` | `memoryview` (read-only, zero-copy; see `buffer`) |
//! | `Tensor` | `numpy.ndarray` (read-only, zero-copy) |
//! | `Str` | `str` |
//! | `Int` / `Float` | `int` / `float` |
//! | `List` | `list` |
//! | `Null` | `None` |
//!
//! In (`from_samples`, the results of Python map functions), the reverse, copying:
//! `bytes`-like objects become `Bytes`, NumPy arrays tensors, `bool` an integer. A
//! memoryview or array that is a whole, contiguous view of one of the engine's own buffers
//! (a field a Python function returned unchanged) is not copied: the value takes the same
//! bytes again.

use std::sync::Arc;

use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple,
};
use stoker_core::{Batch, DType, Sample, Tensor, Value};
use stoker_pipeline::Item;

use crate::buffer::{memoryview, ndarray, Buffer};

/// One value as a Python object.
pub(crate) fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Bytes(b) => memoryview(py, b.clone())?,
        Value::Tensor(t) => ndarray(py, t)?,
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::List(items) => {
            let list = PyList::empty(py);
            for it in items {
                list.append(value_to_py(py, it)?)?;
            }
            list.into_any()
        }
        Value::Null => py.None().into_bound(py),
    })
}

/// A sample as a `dict` of its fields (what a Python map function receives).
pub(crate) fn sample_to_py<'py>(py: Python<'py>, s: &Sample) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in s.iter() {
        d.set_item(&**k, value_to_py(py, v)?)?;
    }
    Ok(d)
}

/// A batch as a `dict` of its columns (what the iterator yields, and what a Python
/// function on batches receives).
pub(crate) fn batch_to_py<'py>(py: Python<'py>, b: &Batch) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in b.iter() {
        d.set_item(&**k, value_to_py(py, v)?)?;
    }
    Ok(d)
}

/// A sample or a batch as a `dict` of its fields.
pub(crate) fn item_to_py<'py>(py: Python<'py>, item: &Item) -> PyResult<Bound<'py, PyDict>> {
    match item {
        Item::Sample(s) => sample_to_py(py, s),
        Item::Batch(b) => batch_to_py(py, b),
    }
}

/// The dtype of a NumPy type string (`<f4`, `|u1`, ...).
fn dtype_of(typestr: &str) -> PyResult<DType> {
    let (order, code) = typestr.split_at(1.min(typestr.len()));
    if order == ">" && !code.ends_with('1') {
        return Err(PyValueError::new_err(format!(
            "big-endian arrays ({typestr}) are not supported: convert with \
             .astype('<{code}') first"
        )));
    }
    Ok(match code {
        "u1" | "b1" => DType::U8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => {
            return Err(PyValueError::new_err(format!(
                "arrays of dtype {typestr} cannot become Stoker tensors (uint8, bool, int16, \
                 int32, int64, float16, float32, float64)"
            )))
        }
    })
}

/// The [`Buffer`] `obj` is a whole, contiguous view of (a memoryview or a NumPy array the
/// engine handed out, passed through a Python function unchanged), with its bytes.
fn whole_view_of_buffer(obj: &Bound<'_, PyAny>, owner: &str) -> PyResult<Option<Bytes>> {
    let Ok(base) = obj.getattr(owner) else {
        return Ok(None);
    };
    let Ok(buffer) = base.cast::<Buffer>() else {
        return Ok(None);
    };
    let bytes = buffer.get().bytes();
    let nbytes: usize = obj.getattr("nbytes")?.extract()?;
    let contiguous: bool = if owner == "obj" {
        obj.getattr("c_contiguous")?.extract()?
    } else {
        obj.getattr("flags")?.getattr("c_contiguous")?.extract()?
    };
    if nbytes != bytes.len() || !contiguous {
        return Ok(None);
    }
    if owner == "base" {
        // An array: it must also start where the buffer does.
        let address: usize = obj
            .getattr("__array_interface__")?
            .get_item("data")?
            .get_item(0)?
            .extract()?;
        if address != bytes.as_ptr() as usize {
            return Ok(None);
        }
    }
    Ok(Some(bytes))
}

/// A Python object as a `Value`: the engine's own bytes again when `obj` is a whole view of
/// them (a field a Python function passed through), else a copy.
pub(crate) fn py_to_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let py = obj.py();
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_instance_of::<PyMemoryView>() {
        if let Some(bytes) = whole_view_of_buffer(obj, "obj")? {
            return Ok(Value::Bytes(bytes));
        }
    } else if obj.hasattr("__array_interface__")? {
        if let Some(bytes) = whole_view_of_buffer(obj, "base")? {
            let typestr: String = obj.getattr("dtype")?.getattr("str")?.extract()?;
            let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
            return Tensor::new(dtype_of(&typestr)?, shape, bytes)
                .map(Value::Tensor)
                .map_err(|e| PyValueError::new_err(e.message));
        }
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Int(b.is_true() as i64));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Value::Int(obj.extract::<i64>()?));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(obj.extract::<f64>()?));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(Arc::from(s.to_str()?)));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(Bytes::copy_from_slice(b.as_bytes())));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Bytes(Bytes::from(b.to_vec())));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l
            .iter()
            .map(|x| py_to_value(&x))
            .collect::<PyResult<_>>()
            .map(Value::List);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| py_to_value(&x))
            .collect::<PyResult<_>>()
            .map(Value::List);
    }
    if obj.hasattr("__array_interface__")? && obj.hasattr("tobytes")? {
        let typestr: String = obj.getattr("dtype")?.getattr("str")?.extract()?;
        let dtype = dtype_of(&typestr)?;
        let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
        // One copy: the array's bytes as a flat `uint8` view (contiguous arrays are not
        // copied by the reshape), read through the buffer protocol.
        let flat = obj
            .call_method1("reshape", (-1,))?
            .call_method1("view", ("u1",))?;
        let data = Bytes::from(PyBuffer::<u8>::get(&flat)?.to_vec(py)?);
        return Tensor::new(dtype, shape, data)
            .map(Value::Tensor)
            .map_err(|e| PyValueError::new_err(e.message));
    }
    if let Ok(buf) = PyBuffer::<u8>::get(obj) {
        return Ok(Value::Bytes(Bytes::from(buf.to_vec(py)?)));
    }
    Err(PyTypeError::new_err(format!(
        "a sample field cannot be of type {} (bytes, str, int, float, bool, None, list, \
         tuple or a NumPy array)",
        obj.get_type().name()?
    )))
}

/// A `dict` as a sample, an error naming the field whose value cannot be one (what a Python
/// map function returns).
pub(crate) fn py_to_sample_named(obj: &Bound<'_, PyAny>) -> PyResult<Sample> {
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("a sample is a dict of fields"))?;
    let mut s = Sample::with_capacity(d.len());
    for (k, v) in d.iter() {
        let (name, value) = named_field(&k, &v)?;
        s.insert(name, value);
    }
    Ok(s)
}

/// One entry of a sample's or a batch's dict: its name (a `str`) and its value; an error
/// names the field.
fn named_field(k: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> PyResult<(String, Value)> {
    let name: String = k.extract().map_err(|_| {
        PyTypeError::new_err(format!("field names must be str, not {}", type_name(k)))
    })?;
    let value = py_to_value(v).map_err(|e| {
        let py = v.py();
        let class = e.get_type(py);
        PyErr::from_type(class, format!("field {name:?}: {}", e.value(py)))
    })?;
    Ok((name, value))
}

/// A `dict` of columns as a batch of `rows` samples (what a Python function on batches
/// returns): each column a list of `rows` values or an array whose first axis is `rows`;
/// an error names the field whose value cannot be one.
pub(crate) fn py_to_batch_named(obj: &Bound<'_, PyAny>, rows: usize) -> PyResult<Batch> {
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("a batch is a dict of columns"))?;
    let mut b = Batch::with_rows(rows);
    for (k, v) in d.iter() {
        let (name, value) = named_field(&k, &v)?;
        b.insert(name, value)
            .map_err(|e| PyValueError::new_err(e.message))?;
    }
    Ok(b)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A `dict` as a sample.
pub(crate) fn py_to_sample(obj: &Bound<'_, PyAny>) -> PyResult<Sample> {
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("every sample must be a dict of fields"))?;
    let mut s = Sample::with_capacity(d.len());
    for (k, v) in d.iter() {
        let name: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("sample field names must be str"))?;
        s.insert(name, py_to_value(&v)?);
    }
    Ok(s)
}
