//! Plain files and ImageFolder: every object is one sample.
//!
//! A file sample has `__key__` (the key relative to the dataset's prefix, without
//! extension), `__url__`, and the bytes under the field named by the file's extension
//! (`jpg`, `txt`; `data` when there is none), as WebDataset names fields. ImageFolder adds
//! `label`: the index of the parent directory's name among all class directories sorted
//! by name, which is how torchvision's `ImageFolder` numbers classes.

use std::sync::Arc;

use stoker_core::{Error, Sample, Value};

use crate::format::{Format, RecordReader, ShardInfo};
use crate::input::Input;

/// Splits `key` (relative to the prefix) into the sample key and the field name.
pub fn key_and_field(rel: &str) -> (&str, &str) {
    let name_start = rel.rfind('/').map_or(0, |i| i + 1);
    match rel[name_start..].find('.') {
        // WebDataset: the field is everything after the first dot of the file name.
        Some(dot) if dot > 0 => (&rel[..name_start + dot], &rel[name_start + dot + 1..]),
        _ => (rel, "data"),
    }
}

/// Every object is one sample.
#[derive(Debug, Clone, Default)]
pub struct Files {
    /// The dataset prefix, stripped from keys to make `__key__`.
    pub prefix: String,
}

impl Format for Files {
    fn name(&self) -> &'static str {
        "files"
    }
    fn one_sample_per_object(&self) -> bool {
        true
    }
    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        Ok(Box::new(OneSample {
            sample: Some((shard.clone(), input, self.prefix.clone(), None)),
        }))
    }
}

/// Files in class directories: `prefix/<class>/<file>`, labelled by class index.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    /// The dataset prefix.
    pub prefix: String,
    /// Class names, sorted (index = label).
    pub classes: Arc<Vec<String>>,
}

impl ImageFolder {
    /// Classes from the keys under `prefix`: the first path component below it, sorted
    /// by name (byte order, as Python sorts `str`).
    pub fn from_keys<'a>(prefix: &str, keys: impl IntoIterator<Item = &'a str>) -> ImageFolder {
        let mut classes: Vec<String> = keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(prefix))
            .filter_map(|rel| rel.split_once('/').map(|(c, _)| c.to_string()))
            .collect();
        classes.sort();
        classes.dedup();
        ImageFolder {
            prefix: prefix.to_string(),
            classes: Arc::new(classes),
        }
    }

    /// The label of `key`, if it lies in a class directory.
    pub fn label_of(&self, key: &str) -> Option<i64> {
        let rel = key.strip_prefix(&self.prefix)?;
        let (class, _) = rel.split_once('/')?;
        self.classes
            .binary_search_by(|c| c.as_str().cmp(class))
            .ok()
            .map(|i| i as i64)
    }
}

impl Format for ImageFolder {
    fn name(&self) -> &'static str {
        "imagefolder"
    }
    fn one_sample_per_object(&self) -> bool {
        true
    }
    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        let label = self.label_of(&shard.key).ok_or_else(|| {
            Error::record(format!(
                "not inside a class directory under {:?}",
                self.prefix
            ))
            .with_stage("imagefolder")
            .with_object(shard.url.clone())
        })?;
        Ok(Box::new(OneSample {
            sample: Some((shard.clone(), input, self.prefix.clone(), Some(label))),
        }))
    }
}

struct OneSample {
    sample: Option<(ShardInfo, Input, String, Option<i64>)>,
}

impl RecordReader for OneSample {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        let Some((shard, input, prefix, label)) = self.sample.take() else {
            return Ok(None);
        };
        let bytes = match input {
            Input::Stream(mut c) => {
                let mut parts = Vec::new();
                loop {
                    let b = c.read_up_to(usize::MAX >> 1).map_err(|e| {
                        Error::from(e)
                            .with_stage("files")
                            .with_object(shard.url.clone())
                    })?;
                    if b.is_empty() {
                        break;
                    }
                    parts.push(b);
                }
                if parts.len() == 1 {
                    parts.pop().expect("one part")
                } else {
                    parts.concat().into()
                }
            }
            Input::Random(r) => r.read_range(0, r.len()).map_err(|e| {
                Error::from(e)
                    .with_stage("files")
                    .with_object(shard.url.clone())
            })?,
        };
        let rel = shard.key.strip_prefix(&prefix).unwrap_or(&shard.key);
        let (key, field) = key_and_field(rel);
        let mut s = Sample::with_capacity(4);
        s.insert("__key__", key);
        s.insert("__url__", shard.url.as_str());
        s.insert(field, Value::Bytes(bytes));
        if let Some(l) = label {
            s.insert("label", l);
        }
        Ok(Some(s))
    }

    fn record(&self) -> u64 {
        u64::from(self.sample.is_none())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::input::ChunkCursor;

    #[test]
    fn keys_and_fields_follow_webdataset() {
        assert_eq!(key_and_field("a/b/img001.jpg"), ("a/b/img001", "jpg"));
        assert_eq!(key_and_field("a/x.seg.png"), ("a/x", "seg.png"));
        assert_eq!(key_and_field("noext"), ("noext", "data"));
        assert_eq!(key_and_field("d.v/.hidden"), ("d.v/.hidden", "data"));
    }

    #[test]
    fn imagefolder_labels_sort_like_torchvision() {
        let keys = ["p/dog/1.jpg", "p/cat/2.jpg", "p/Zebra/3.jpg", "p/cat/4.jpg"];
        let f = ImageFolder::from_keys("p/", keys);
        assert_eq!(&*f.classes, &["Zebra", "cat", "dog"]);
        let shard = ShardInfo::new("p/dog/1.jpg", "s3://b/p/dog/1.jpg");
        let mut r = f
            .open(
                &shard,
                Input::Stream(ChunkCursor::from_bytes(Bytes::from_static(b"xy"))),
            )
            .unwrap();
        let s = r.next().unwrap().unwrap();
        assert_eq!(s.get("label"), Some(&Value::Int(2)));
        assert_eq!(s.key(), Some("dog/1"));
        assert_eq!(s.get("jpg"), Some(&Value::Bytes(Bytes::from_static(b"xy"))));
        assert!(r.next().unwrap().is_none());
    }
}
