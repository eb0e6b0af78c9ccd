//! Keys that cannot be file names, and keys on a terminal.
//!
//! S3 accepts any UTF-8 as a key: control characters (`\x01`, a newline, ESC), `.` and `..`
//! segments, empty segments (`a//b`, a leading `/`). None of those can be a POSIX file name,
//! and `object_store` refuses to represent them at all: a listing page holding one fails as a
//! whole, which made the whole prefix unlistable (for `stoker ls`, every pipeline over it and
//! the mount) because of one key. Such keys are now **skipped and counted**: a listing
//! ([`Listing::skipped`](crate::Listing::skipped)) names each one, and the store logs one
//! warning per listing naming them, escaped. They are skipped in the same place for every
//! consumer (the store's listings), so `stoker ls`, `stoker.io.ls`, pipelines and the mount
//! agree on what a prefix holds.
//!
//! How: the HTTP responses of S3/GCS (`list-type=2`), Azure (`comp=list`) and WebDAV
//! (`PROPFIND`, for plain `http://` stores, whose `href`s are percent-encoded paths) listings are
//! looked at before `object_store` parses them (in the store's own HTTP connector, which sees
//! every response anyway), and each key or prefix that `object_store` could not parse is
//! replaced by a stand-in that it can, carrying the original key in hex; the store turns the
//! stand-ins back into skipped keys. Local directories are listed by the store itself
//! (`local.rs`), which skips such names directly.
//!
//! [`escape_key`] is the one way a key reaches a terminal or a log: control characters
//! (C0, DEL, C1), bidirectional and invisible formatting characters and line separators are
//! written as escapes, so a key cannot move the cursor, recolour the terminal, retitle the
//! window, split a log line or reorder what is shown. Backslashes are doubled so that an
//! escaped key is never mistaken for one that spells out the escape (`stoker ls --json`
//! prints keys exactly, JSON-escaped).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Why a key was left out of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// The key holds a control character (`\x00`-`\x1f`, `\x7f`).
    ControlCharacter,
    /// A segment of the key is `.` or `..`.
    DotSegment,
    /// A segment of the key is empty (`a//b`, a leading `/`).
    EmptySegment,
    /// A local file name that is not UTF-8.
    NotUtf8,
    /// A local symbolic link that resolves outside the listing's root (store option
    /// `follow_symlinks=true` follows it).
    SymlinkOutOfRoot,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::ControlCharacter => "a control character",
            SkipReason::DotSegment => "a `.` or `..` segment",
            SkipReason::EmptySegment => "an empty segment",
            SkipReason::NotUtf8 => "a name that is not UTF-8",
            SkipReason::SymlinkOutOfRoot => "a symbolic link out of the root",
        })
    }
}

/// One key left out of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Skipped {
    /// The key exactly as the server (or the directory) has it; a sub-prefix ends in `/`
    /// (everything under it is skipped with it). Print it with [`escape_key`].
    pub key: String,
    /// Why.
    pub reason: SkipReason,
}

/// Why `key` cannot be a path of file names, if it cannot. A trailing `/` (a "directory
/// marker" object, or a sub-prefix) is allowed; every other segment must be a non-empty
/// name other than `.` and `..`, without control characters. These are exactly the keys
/// `object_store` cannot represent, plus a leading `/` (which it would silently drop, so
/// that a read would ask for another key).
pub fn key_problem(key: &str) -> Option<SkipReason> {
    if key.chars().any(|c| c.is_ascii_control()) {
        return Some(SkipReason::ControlCharacter);
    }
    let body = key.strip_suffix('/').unwrap_or(key);
    if body.is_empty() {
        return (!key.is_empty()).then_some(SkipReason::EmptySegment);
    }
    for seg in body.split('/') {
        match seg {
            "" => return Some(SkipReason::EmptySegment),
            "." | ".." => return Some(SkipReason::DotSegment),
            _ => {}
        }
    }
    None
}

/// Whether `name` is one file name (no `/`) that [`key_problem`] accepts.
pub fn is_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && key_problem(name).is_none()
}

/// Characters that change what a terminal shows beyond themselves: bidirectional controls,
/// zero-width and invisible formatting characters, line and paragraph separators.
fn is_format_char(c: char) -> bool {
    matches!(c,
        '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

fn needs_escape(c: char) -> bool {
    c == '\\' || c.is_control() || is_format_char(c)
}

/// `key` as it may be written to a terminal or a log: unchanged unless it holds a
/// backslash, a control character (C0, DEL, C1) or a formatting character (bidirectional
/// overrides, zero-width characters, line separators); those are written `\\`, `\n`, `\t`,
/// `\r`, `\xNN` (other ASCII controls and DEL) and `\u{NNNN}`.
pub fn escape_key(key: &str) -> Cow<'_, str> {
    if !key.chars().any(needs_escape) {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A `Display` of text through [`escape_key`], for messages that embed a key or a URL.
pub(crate) struct Escaped<'a>(pub &'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&escape_key(self.0))
    }
}

/// A `Display` of an error's text through [`escape_key`] (a backend's message may quote a
/// key, and the server's own words).
pub(crate) struct EscapedError<'a, E: std::fmt::Display>(pub &'a E);

impl<E: std::fmt::Display> std::fmt::Display for EscapedError<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&escape_key(&self.0.to_string()))
    }
}

/// The one warning a listing gives for the keys it skipped: how many, under what, and the
/// first few, escaped.
pub(crate) fn warn_skipped(what: &str, skipped: &[Skipped]) {
    if skipped.is_empty() {
        return;
    }
    const SHOWN: usize = 10;
    let mut names = String::new();
    for s in skipped.iter().take(SHOWN) {
        if !names.is_empty() {
            names.push_str(", ");
        }
        let _ = write!(names, "\"{}\" ({})", escape_key(&s.key), s.reason);
    }
    if skipped.len() > SHOWN {
        let _ = write!(names, ", and {} more", skipped.len() - SHOWN);
    }
    let n = skipped.len();
    tracing::warn!(
        "{n} {} under {} cannot be file names and {} skipped: {names}",
        if n == 1 { "key" } else { "keys" },
        escape_key(what),
        if n == 1 { "is" } else { "are" },
    );
}

/// Marks a stand-in key: the original follows, in hex. U+FDD0 is a noncharacter, which no
/// sensible key holds (and one that does is still only taken for a stand-in when what
/// follows decodes to a key `object_store` could not have parsed).
const STAND_IN: &str = "\u{fdd0}stoker-skipped-key\u{fdd0}";

fn stand_in(key: &[u8]) -> String {
    let mut s = String::with_capacity(STAND_IN.len() + 2 * key.len());
    s.push_str(STAND_IN);
    for b in key {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The original key a location stands in for and why it was left out, if it is a stand-in;
/// the reason is `None` for a directory marker (a key ending in `/` listed as an object),
/// which the caller drops.
pub(crate) fn stood_in(location: &str) -> Option<(String, Option<SkipReason>)> {
    let hex = location.strip_prefix(STAND_IN)?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let key = String::from_utf8_lossy(&bytes).into_owned();
    let reason = match std::str::from_utf8(&bytes) {
        Ok(_) => key_problem(&key),
        Err(_) => Some(SkipReason::NotUtf8),
    };
    (reason.is_some() || key.ends_with('/')).then_some((key, reason))
}

/// The original key a location stands in for, if it is a stand-in ([`stood_in`]).
#[cfg(test)]
pub(crate) fn from_stand_in(location: &str) -> Option<String> {
    stood_in(location).map(|(key, _)| key)
}

/// Which listing format a request asks for, by its query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListFormat {
    /// S3 ListObjectsV2, and GCS's XML API: `<Contents><Key>`, `<CommonPrefixes><Prefix>`.
    S3,
    /// Azure List Blobs: `<Blob><Name>`, `<BlobPrefix><Name>`.
    Azure,
    /// WebDAV `PROPFIND` (plain HTTP stores): each `<D:href>` (any namespace prefix) holds
    /// a URL or absolute path, percent-encoded.
    WebDav,
}

/// The listing format of a request, if it is a listing.
pub(crate) fn list_format(method: &str, query: Option<&str>) -> Option<ListFormat> {
    if method == "PROPFIND" {
        return Some(ListFormat::WebDav);
    }
    if method != "GET" {
        return None;
    }
    let q = query?;
    let has = |p: &str| q.split('&').any(|kv| kv == p);
    if has("list-type=2") {
        Some(ListFormat::S3)
    } else if has("comp=list") && has("restype=container") {
        Some(ListFormat::Azure)
    } else {
        None
    }
}

/// Undoes XML escapes: the five named entities and numeric character references. `None`
/// when the text is not well-formed (then it is left for `object_store` to judge).
fn xml_unescape(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'&' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        let end = i + text[i..].iter().position(|&b| b == b';')?;
        let ent = std::str::from_utf8(&text[i + 1..end]).ok()?;
        match ent {
            "amp" => out.push(b'&'),
            "lt" => out.push(b'<'),
            "gt" => out.push(b'>'),
            "quot" => out.push(b'"'),
            "apos" => out.push(b'\''),
            _ => {
                let n = if let Some(h) = ent.strip_prefix("#x").or(ent.strip_prefix("#X")) {
                    u32::from_str_radix(h, 16).ok()?
                } else {
                    ent.strip_prefix('#')?.parse().ok()?
                };
                let c = char::from_u32(n)?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
        i = end + 1;
    }
    Some(out)
}

/// A listing response's body with every key that `object_store` could not parse replaced by
/// a stand-in (see the module docs); `None` when nothing needs replacing (the body is used
/// as it is). Directory markers (keys ending in `/` among the objects) are replaced too,
/// since `object_store` would drop their slash and list them as objects named like their
/// directory.
pub(crate) fn rewrite_listing(body: &[u8], format: ListFormat) -> Option<Vec<u8>> {
    // (element holding a key, whether it is an object's key)
    let tags: &[(&[u8], &[u8], bool)] = match format {
        ListFormat::S3 => &[
            (b"<Key>", b"</Key>", true),
            (b"<Prefix>", b"</Prefix>", false),
        ],
        ListFormat::Azure => &[(b"<Name>", b"</Name>", true)],
        ListFormat::WebDav => return rewrite_propfind(body),
    };
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0; // body[..copied] is in `out` already
    let mut i = 0;
    while i < body.len() {
        let Some(rel) = body[i..].iter().position(|&b| b == b'<') else {
            break;
        };
        i += rel;
        let Some(&(open, close, object)) = tags.iter().find(|(o, _, _)| body[i..].starts_with(o))
        else {
            i += 1;
            continue;
        };
        let start = i + open.len();
        let Some(len) = body[start..].windows(close.len()).position(|w| w == close) else {
            break;
        };
        let end = start + len;
        i = end + close.len();
        let Some(raw) = xml_unescape(&body[start..end]) else {
            continue;
        };
        let key = String::from_utf8_lossy(&raw);
        // An Azure <Name> of a prefix ends in `/` too: only S3's <Key> is surely an object.
        let marker = object && format == ListFormat::S3 && key.len() > 1 && key.ends_with('/');
        if key_problem(&key).is_none() && !marker {
            continue;
        }
        let o = out.get_or_insert_with(|| Vec::with_capacity(body.len() + 64));
        o.extend_from_slice(&body[copied..start]);
        o.extend_from_slice(stand_in(&raw).as_bytes());
        copied = end;
    }
    let mut o = out?;
    o.extend_from_slice(&body[copied..]);
    Some(o)
}

/// [`rewrite_listing`] for a WebDAV multistatus: each `href` element whose path (percent-
/// decoded; the server's absolute path, which is the key for a plain HTTP store) cannot be
/// parsed by `object_store` gets a stand-in path, percent-encoded, in its place.
fn rewrite_propfind(body: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while let Some(rel) = body[i..].iter().position(|&b| b == b'<') {
        i += rel + 1;
        // The element's name, up to `>` (an `href` carries no attributes).
        let Some(n) = body[i..].iter().position(|&b| b == b'>') else {
            break;
        };
        let name = &body[i..i + n];
        let local = name.rsplit(|&b| b == b':').next().unwrap_or(name);
        if local != b"href" || name.starts_with(b"/") {
            i += n;
            continue;
        }
        let start = i + n + 1;
        let close = [b"</", name, b">"].concat();
        let Some(len) = body[start..].windows(close.len()).position(|w| w == close) else {
            break;
        };
        let end = start + len;
        i = end + close.len();
        let Some(raw) = xml_unescape(&body[start..end]) else {
            continue;
        };
        let key = href_key(&raw);
        let fine = std::str::from_utf8(&key).is_ok_and(|k| key_problem(k).is_none());
        if fine {
            continue;
        }
        let o = out.get_or_insert_with(|| Vec::with_capacity(body.len() + 64));
        o.extend_from_slice(&body[copied..start]);
        o.push(b'/');
        for b in stand_in(&key).bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' {
                o.push(b);
            } else {
                let _ = write!(HexTo(o), "%{b:02X}");
            }
        }
        copied = end;
    }
    let mut o = out?;
    o.extend_from_slice(&body[copied..]);
    Some(o)
}

/// The key an `href` names: its path (after the authority, without a query or fragment),
/// percent-decoded, without the leading `/`, as bytes (a server may list names that are
/// not UTF-8).
fn href_key(href: &[u8]) -> Vec<u8> {
    let text = href.trim_ascii();
    let path = match text.windows(3).position(|w| w == b"://") {
        Some(at) => {
            let rest = &text[at + 3..];
            &rest[rest.iter().position(|&b| b == b'/').unwrap_or(rest.len())..]
        }
        None => text,
    };
    let path = &path[..path
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(path.len())];
    let path = path.strip_prefix(b"/").unwrap_or(path);
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' && i + 2 < path.len() {
            if let (Some(h), Some(l)) = (hex(path[i + 1]), hex(path[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(path[i]);
        i += 1;
    }
    out
}

/// `write!` into a byte vector.
struct HexTo<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for HexTo<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_cannot_be_file_names_are_named() {
        use SkipReason::*;
        for (key, want) in [
            ("a/b.jpg", None),
            ("a/", None),
            ("with space é.txt", None),
            ("a/..b/c.", None),
            ("a\u{1}b", Some(ControlCharacter)),
            ("a\nb", Some(ControlCharacter)),
            ("esc\u{1b}[31m", Some(ControlCharacter)),
            ("del\u{7f}", Some(ControlCharacter)),
            ("..", Some(DotSegment)),
            (".", Some(DotSegment)),
            ("a/../b", Some(DotSegment)),
            ("a/./b", Some(DotSegment)),
            ("a//b", Some(EmptySegment)),
            ("/a", Some(EmptySegment)),
            ("a//", Some(EmptySegment)),
            ("/", Some(EmptySegment)),
            ("", None),
        ] {
            assert_eq!(key_problem(key), want, "{key:?}");
        }
        assert!(is_file_name("x.jpg"));
        for bad in ["", ".", "..", "a/b", "a\u{1}"] {
            assert!(!is_file_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn escaping_leaves_ordinary_keys_alone_and_neutralises_the_rest() {
        assert!(matches!(escape_key("data/é 日本.jpg"), Cow::Borrowed(_)));
        assert_eq!(escape_key("a\u{1b}]0;title\u{7}b"), "a\\x1b]0;title\\x07b");
        assert_eq!(escape_key("line\nnext\tx\r"), "line\\nnext\\tx\\r");
        assert_eq!(escape_key("c1\u{9b}31m"), "c1\\u{9b}31m");
        assert_eq!(escape_key("bidi\u{202e}gpj.exe"), "bidi\\u{202e}gpj.exe");
        assert_eq!(escape_key("zw\u{200b}sp\u{2028}"), "zw\\u{200b}sp\\u{2028}");
        // A backslash is doubled, so a key spelling out an escape stays distinguishable.
        assert_eq!(escape_key("a\\x01"), "a\\\\x01");
        assert_ne!(escape_key("a\\x01"), escape_key("a\u{1}"));
        for k in ["a\u{1}", "\u{1b}[2J", "x\u{85}y", "\u{2066}"] {
            let e = escape_key(k);
            assert!(
                !e.chars().any(|c| c.is_control() || is_format_char(c)),
                "{e}"
            );
        }
    }

    #[test]
    fn errors_show_keys_escaped() {
        let e = crate::Error::NotFound {
            url: "s3://b/a\u{1b}[31mred".into(),
        };
        assert_eq!(e.to_string(), "object not found: s3://b/a\\x1b[31mred");
    }

    #[test]
    fn stand_ins_round_trip_only_for_keys_that_need_them() {
        for key in ["a\u{1}b", "data/../x", "a//b", "dir/", "\u{1b}[31m/"] {
            assert_eq!(
                from_stand_in(&stand_in(key.as_bytes())).as_deref(),
                Some(key)
            );
        }
        // A stand-in whose key is fine is taken for the key it is.
        assert_eq!(from_stand_in(&stand_in(b"fine")), None);
        assert_eq!(from_stand_in("plain/key"), None);
        assert_eq!(from_stand_in(&format!("{STAND_IN}zz")), None);
        // A stand-in is a key object_store accepts.
        let s = stand_in("a/\u{1}/..".as_bytes());
        assert!(object_store::path::Path::parse(&s).is_ok(), "{s}");
    }

    #[test]
    fn an_s3_listing_keeps_good_keys_and_stands_in_for_bad_ones() {
        let body = "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name><Prefix>d/</Prefix>\
            <Contents><Key>d/ok &amp; fine.txt</Key><Size>1</Size></Contents>\
            <Contents><Key>d/bad\u{1}key</Key><Size>2</Size></Contents>\
            <Contents><Key>d/ent&#x1b;[31m</Key><Size>3</Size></Contents>\
            <Contents><Key>d/..</Key><Size>4</Size></Contents>\
            <Contents><Key>d/</Key><Size>0</Size></Contents>\
            <CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes>\
            <CommonPrefixes><Prefix>d//</Prefix></CommonPrefixes>\
            <CommonPrefixes><Prefix>d/a\nb/</Prefix></CommonPrefixes>\
            </ListBucketResult>";
        let out = rewrite_listing(body.as_bytes(), ListFormat::S3).expect("rewritten");
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("<Key>d/ok &amp; fine.txt</Key>"), "{out}");
        assert!(out.contains("<Prefix>d/</Prefix>"), "{out}");
        assert!(out.contains("<Prefix>d/sub/</Prefix>"), "{out}");
        let stood_in: Vec<String> = out.split(['<', '>']).filter_map(from_stand_in).collect();
        assert_eq!(
            stood_in,
            [
                "d/bad\u{1}key",
                "d/ent\u{1b}[31m",
                "d/..",
                "d/",
                "d//",
                "d/a\nb/"
            ]
        );
        assert!(!out.contains('\u{1}') && !out.contains('\n'), "{out}");
        // Nothing to replace: the body is used as it is.
        let clean = "<ListBucketResult><Contents><Key>a/b</Key></Contents></ListBucketResult>";
        assert_eq!(rewrite_listing(clean.as_bytes(), ListFormat::S3), None);
    }

    #[test]
    fn a_webdav_listing_stands_in_for_bad_hrefs_as_object_store_parses_them() {
        let body = "<?xml version='1.0' encoding='UTF-8'?>\
            <ns0:multistatus xmlns:ns0=\"DAV:\">\
            <ns0:response><ns0:href>/d/</ns0:href></ns0:response>\
            <ns0:response><ns0:href>/d/ok%20%26%20fine.txt</ns0:href></ns0:response>\
            <ns0:response><ns0:href>/d/a%01b.txt</ns0:href></ns0:response>\
            <ns0:response><ns0:href>http://h:8/d/%1B%5B31m/</ns0:href></ns0:response>\
            <ns0:response><ns0:href>/d/%FF.bin</ns0:href></ns0:response>\
            <D:response><D:href>/d//x?q=1</D:href></D:response>\
            </ns0:multistatus>";
        let out = rewrite_listing(body.as_bytes(), ListFormat::WebDav).expect("rewritten");
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("<ns0:href>/d/</ns0:href>"), "{out}");
        assert!(out.contains("/d/ok%20%26%20fine.txt<"), "{out}");
        // What object_store makes of each href: its path, percent-decoded, as a Path.
        let locations: Vec<String> = out
            .split(['<', '>'])
            .filter(|t| t.starts_with('/'))
            .map(|t| String::from_utf8(href_key(t.as_bytes())).unwrap())
            .collect();
        let stood: Vec<_> = locations.iter().filter_map(|l| stood_in(l)).collect();
        use SkipReason::*;
        assert_eq!(
            stood,
            [
                ("d/a\u{1}b.txt".to_string(), Some(ControlCharacter)),
                ("d/\u{1b}[31m/".to_string(), Some(ControlCharacter)),
                ("d/\u{fffd}.bin".to_string(), Some(NotUtf8)),
                ("d//x".to_string(), Some(EmptySegment)),
            ]
        );
        for l in &locations {
            assert!(
                object_store::path::Path::parse(l).is_ok(),
                "{l:?} would fail the listing"
            );
        }
        let clean = "<multistatus><response><href>/a/b</href></response></multistatus>";
        assert_eq!(rewrite_listing(clean.as_bytes(), ListFormat::WebDav), None);
        assert_eq!(list_format("PROPFIND", None), Some(ListFormat::WebDav));
    }

    #[test]
    fn an_azure_listing_stands_in_for_bad_names() {
        let body = "<EnumerationResults><Blobs><Blob><Name>p/ok</Name></Blob>\
            <Blob><Name>p/x\u{7}</Name></Blob><BlobPrefix><Name>p//</Name></BlobPrefix>\
            </Blobs></EnumerationResults>";
        let out = rewrite_listing(body.as_bytes(), ListFormat::Azure).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("<Name>p/ok</Name>"));
        let stood_in: Vec<String> = out.split(['<', '>']).filter_map(from_stand_in).collect();
        assert_eq!(stood_in, ["p/x\u{7}", "p//"]);
    }

    #[test]
    fn list_requests_are_recognised() {
        assert_eq!(
            list_format("GET", Some("list-type=2&prefix=a%2F")),
            Some(ListFormat::S3)
        );
        assert_eq!(
            list_format("GET", Some("restype=container&comp=list")),
            Some(ListFormat::Azure)
        );
        assert_eq!(list_format("GET", None), None);
        assert_eq!(list_format("PUT", Some("list-type=2")), None);
    }
}
