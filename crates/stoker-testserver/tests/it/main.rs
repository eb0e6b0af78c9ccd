//! Integration tests: the server driven by real HTTP clients (`object_store`'s S3 client and
//! hand-written HTTP/1.1 over TCP).

mod binary;
mod confinement;
mod control;
mod faults;
mod objects;
mod support;
