//! Format choice: the record format a name in a spec or the Python API stands for, with its
//! options ([`named_format`]), and `format = "auto"`: the format the listed objects'
//! extensions name ([`detect_format`]), decided when a run lists its source. A format option
//! given for another format is refused rather than ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use stoker_core::Error;
use stoker_formats::csv::Csv;
use stoker_formats::jsonl::Jsonl;
use stoker_formats::parquet::Parquet;
use stoker_formats::tar::Tar;
use stoker_formats::tfrecord::TfRecord;
use stoker_formats::Format;

/// The record format, resolved once the listing is known (ImageFolder needs the classes).
#[derive(Debug, Clone)]
pub enum FormatChoice {
    /// Every object is one sample.
    Files,
    /// Every object is one sample labelled by its class directory.
    ImageFolder,
    /// A fixed format.
    Fixed(Arc<dyn Format>),
    /// Chosen from the listed objects' extensions when a run lists the source (`.tar`,
    /// `.tfrecord`, `.parquet`, `.jsonl`, `.csv`; objects with none of them: files), with
    /// these format options (see [`detect_format`]).
    Auto(Arc<FormatOptions>),
}

/// The keys of [`FormatOptions`], each with the format that reads it.
pub const FORMAT_OPTION_KEYS: &[(&str, &str)] = &[
    ("parse_examples", "tfrecord"),
    ("columns", "parquet"),
    ("delimiter", "csv"),
    ("has_header", "csv"),
    ("infer_types", "csv"),
];

/// Format options; each format reads the ones it knows.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatOptions {
    /// TFRecord: decode `tf.train.Example`s (default true).
    #[serde(default)]
    pub parse_examples: Option<bool>,
    /// Parquet: columns to read.
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// CSV: the delimiter (one character).
    #[serde(default)]
    pub delimiter: Option<String>,
    /// CSV: the first row names the fields (default true).
    #[serde(default)]
    pub has_header: Option<bool>,
    /// CSV: numbers become numbers (default true).
    #[serde(default)]
    pub infer_types: Option<bool>,
}

impl FormatOptions {
    /// Refuses options the format does not read (a `columns` given for CSV would otherwise
    /// be ignored without a word).
    fn check(&self, format: &str) -> Result<(), Error> {
        let given = [
            self.parse_examples.is_some(),
            self.columns.is_some(),
            self.delimiter.is_some(),
            self.has_header.is_some(),
            self.infer_types.is_some(),
        ];
        for (&(name, owner), set) in FORMAT_OPTION_KEYS.iter().zip(given) {
            if set && format != owner {
                return Err(Error::invalid(format!(
                    "format option {name} is for the {owner} format, not {format}"
                )));
            }
        }
        Ok(())
    }
}

/// The format called `name` in a spec, with its options (`auto`: chosen when a run lists
/// the source, see [`detect_format`]).
pub(crate) fn named_format(name: &str, fo: &FormatOptions) -> Result<FormatChoice, Error> {
    if name == "auto" {
        return Ok(FormatChoice::Auto(Arc::new(fo.clone())));
    }
    fo.check(name)?;
    let fixed = |f: Arc<dyn Format>| FormatChoice::Fixed(f);
    Ok(match name {
        "files" => FormatChoice::Files,
        "imagefolder" => FormatChoice::ImageFolder,
        "tar" | "webdataset" => fixed(Arc::new(Tar)),
        "tfrecord" => fixed(Arc::new(TfRecord {
            parse_examples: fo.parse_examples.unwrap_or(true),
        })),
        "parquet" => fixed(Arc::new(Parquet {
            columns: fo.columns.clone(),
        })),
        "jsonl" => fixed(Arc::new(Jsonl)),
        "csv" => {
            let mut c = Csv::default();
            if let Some(d) = &fo.delimiter {
                let b = d.as_bytes();
                if b.len() != 1 {
                    return Err(Error::invalid(format!(
                        "csv delimiter must be one byte, not {d:?}"
                    )));
                }
                c.delimiter = b[0];
            }
            if let Some(h) = fo.has_header {
                c.has_header = h;
            }
            if let Some(t) = fo.infer_types {
                c.infer_types = t;
            }
            fixed(Arc::new(c))
        }
        other => {
            return Err(Error::invalid(format!(
                "unknown format {other:?} (auto, files, imagefolder, tar, tfrecord, parquet, \
                 jsonl, csv)"
            )))
        }
    })
}

/// The record formats `auto` recognises, by the end of an object's name (lower case).
const EXTENSIONS: &[(&str, &str)] = &[
    (".tar", "tar"),
    (".tfrecord", "tfrecord"),
    (".tfrecords", "tfrecord"),
    (".tfrec", "tfrecord"),
    (".parquet", "parquet"),
    (".pq", "parquet"),
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
    (".csv", "csv"),
];

/// The format of `keys` (the objects listed under `url`) for `format = "auto"`: the record
/// format their extensions name when they all name the same one, `files` when none names
/// one. Objects of two formats, or of one format mixed with others (an index, a README),
/// are refused with both named: reading the others as records, or leaving them out, would
/// be a guess. `fo` must hold only options of the format chosen.
pub fn detect_format<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    fo: &FormatOptions,
    url: &str,
) -> Result<FormatChoice, Error> {
    // Per format: how many objects, and the first one.
    let mut found: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    let mut others: (u64, Option<&str>) = (0, None);
    for key in keys {
        let name = key.rsplit('/').next().unwrap_or(key).to_ascii_lowercase();
        match EXTENSIONS.iter().find(|(ext, _)| name.ends_with(ext)) {
            Some((_, format)) => found.entry(format).or_insert((0, key)).0 += 1,
            None => {
                others.0 += 1;
                others.1.get_or_insert(key);
            }
        }
    }
    let how = "name the format (format = ...), and a glob (such as \"*.tar\") to read only \
               the objects of that format";
    let chosen = match (found.len(), others) {
        (0, _) => "files",
        (1, (0, _)) => *found.keys().next().expect("one"),
        (1, (n, Some(other))) => {
            let (format, (m, example)) = found.iter().next().expect("one");
            return Err(Error::invalid(format!(
                "format \"auto\": under {url}, {m} objects are {format} ({example}) and {n} \
                 are not ({other}): {how}"
            )));
        }
        _ => {
            let list: Vec<String> = found
                .iter()
                .map(|(f, (n, example))| format!("{n} {f} ({example})"))
                .collect();
            let rest = match others {
                (0, _) => String::new(),
                (n, _) => format!(" and {n} others"),
            };
            return Err(Error::invalid(format!(
                "format \"auto\": under {url} are objects of several formats, {}{rest}: {how}",
                list.join(", ")
            )));
        }
    };
    named_format(chosen, fo).map_err(|e| {
        Error::invalid(format!(
            "{} (format \"auto\" chose {chosen} for the objects under {url})",
            e.message
        ))
    })
}
