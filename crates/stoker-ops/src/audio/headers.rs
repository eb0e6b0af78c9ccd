//! Checks on header fields that symphonia trusts, run on the input bytes before symphonia
//! reads them, so that a corrupt file is an error naming the field and its byte offset
//! rather than a panic or a huge allocation.
//!
//! - **WAV** (`check_riff`): a sample rate of 0 (symphonia divides by it) and 0 channels.
//! - **Length fields allocated before they are read**: symphonia reads a Vorbis comment
//!   (FLAC's comment block; the comment packet of Ogg Vorbis and Opus), a FLAC picture
//!   block and an ID3v2.3 frame by allocating a zeroed buffer of the 32-bit length the file
//!   gives, then filling it. A corrupt length asks for up to 4 GiB at once (found by
//!   `fuzz/audio`: a FLAC comment of 2,281,680,353 bytes in an 800-byte file); on a machine
//!   without that much memory the allocation aborts the process. Each length is checked here
//!   against what is left of the block, packet or tag that holds it.
//!
//! The checks only refuse what symphonia would also fail on (a length past the end of its
//! container makes the read that follows fail), so they change no verdict on a file, only
//! how it is reached.

use stoker_core::Error;

use super::decode::OP;

fn le32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// A length field that runs past the end of what holds it: the field's offset within the
/// structure, the length it gives and the bytes that were left.
struct Overrun {
    at: usize,
    len: u32,
    left: usize,
}

/// Reads the length at `at` in `b` (with `read`) and checks that it fits in what follows it.
/// `Ok(None)` when `b` ends before the field (symphonia refuses the short read itself).
fn length(
    b: &[u8],
    at: usize,
    read: fn(&[u8], usize) -> Option<u32>,
) -> Result<Option<usize>, Overrun> {
    let Some(len) = read(b, at) else {
        return Ok(None);
    };
    let left = b.len().saturating_sub(at + 4);
    if len as usize > left {
        return Err(Overrun { at, len, left });
    }
    Ok(Some(len as usize))
}

/// A Vorbis comment structure (little-endian): vendor string, count, then each comment.
fn vorbis_comments(b: &[u8]) -> Result<(), Overrun> {
    let Some(vendor) = length(b, 0, le32)? else {
        return Ok(());
    };
    let mut at = 4 + vendor;
    let Some(n) = le32(b, at) else {
        return Ok(());
    };
    at += 4;
    for _ in 0..n {
        let Some(len) = length(b, at, le32)? else {
            return Ok(());
        };
        at += 4 + len;
    }
    Ok(())
}

/// A FLAC picture block (big-endian): type, media type, description, four sizes, data.
fn flac_picture(b: &[u8]) -> Result<(), Overrun> {
    let mut at = 4;
    for skip_after in [0, 16] {
        let Some(len) = length(b, at, be32)? else {
            return Ok(());
        };
        at += 4 + len + skip_after;
    }
    length(b, at, be32).map(|_| ())
}

/// For a RIFF/WAVE stream, checks what symphonia's WAV reader trusts in the `fmt ` chunk:
/// a sample rate of 0 (it divides by it) and 0 channels are refused here, naming the
/// field. Other streams, and WAV files without a `fmt ` chunk before `data`, pass (the
/// reader refuses those itself).
pub(super) fn check_riff(bytes: &[u8]) -> Result<(), Error> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Ok(());
    }
    let mut at = 12usize;
    while let (Some(id), Some(len)) = (bytes.get(at..at + 4), le32(bytes, at + 4)) {
        let body = at + 8;
        match id {
            b"fmt " => {
                let channels = bytes
                    .get(body + 2..body + 4)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]));
                if channels == Some(0) {
                    return Err(Error::operator(format!(
                        "{OP}: the WAV header (fmt chunk at byte {at}) says 0 channels"
                    )));
                }
                if le32(bytes, body + 4) == Some(0) {
                    return Err(Error::operator(format!(
                        "{OP}: the WAV header (fmt chunk at byte {at}) says a sample rate of 0"
                    )));
                }
                return Ok(());
            }
            b"data" => return Ok(()),
            _ => {}
        }
        // Chunks are padded to an even length.
        let next = (len as usize).saturating_add(len as usize & 1);
        at = match body.checked_add(next) {
            Some(n) => n,
            None => return Ok(()),
        };
    }
    Ok(())
}

/// Checks the container whose marker symphonia's probe found at byte `at` of `bytes`,
/// before its reader is made: FLAC's metadata blocks and the comment packets of an Ogg
/// stream.
pub(super) fn check_container(bytes: &[u8], at: usize) -> Result<(), Error> {
    let rest = bytes.get(at..).unwrap_or_default();
    if rest.starts_with(b"fLaC") {
        check_flac(bytes, at)
    } else if rest.starts_with(b"OggS") {
        check_ogg(bytes, at)
    } else {
        Ok(())
    }
}

/// Checks the metadata (an ID3v2 tag) that symphonia's probe found at byte `at`.
pub(super) fn check_metadata(bytes: &[u8], at: usize) -> Result<(), Error> {
    let rest = bytes.get(at..).unwrap_or_default();
    if rest.starts_with(b"ID3") {
        check_id3v2(bytes, at)
    } else {
        Ok(())
    }
}

fn overrun(what: String, base: usize, o: Overrun) -> Error {
    Error::operator(format!(
        "{OP}: {what} gives a length of {} bytes at byte {}, more than the {} left in it",
        o.len,
        base + o.at,
        o.left
    ))
}

fn check_flac(bytes: &[u8], start: usize) -> Result<(), Error> {
    let mut at = start + 4;
    while let Some(h) = bytes.get(at..at + 4) {
        let (last, kind) = (h[0] & 0x80 != 0, h[0] & 0x7f);
        let len = u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
        let body_at = at + 4;
        let end = (body_at + len).min(bytes.len());
        let body = bytes.get(body_at..end).unwrap_or_default();
        let checked = match kind {
            4 => vorbis_comments(body)
                .map_err(|o| (format!("the FLAC comment block at byte {at}"), o)),
            6 => {
                flac_picture(body).map_err(|o| (format!("the FLAC picture block at byte {at}"), o))
            }
            _ => Ok(()),
        };
        checked.map_err(|(what, o)| overrun(what, body_at, o))?;
        if last {
            break;
        }
        at = body_at + len;
    }
    Ok(())
}

/// Reassembles the first packets of each logical stream (Ogg pages carry packets in
/// segments of up to 255 bytes) and checks the second one when it is a Vorbis or Opus
/// comment header. Every stream's first page comes before any stream's second one, so the
/// walk ends once each stream has given its two packets.
fn check_ogg(bytes: &[u8], start: usize) -> Result<(), Error> {
    struct Stream {
        serial: u32,
        packet: Vec<u8>,
        packet_at: usize,
        done: u32,
    }
    let mut streams: Vec<Stream> = Vec::new();
    let mut at = start;
    while let Some(h) = bytes.get(at..at + 27) {
        if &h[..4] != b"OggS" {
            break;
        }
        let serial = u32::from_le_bytes([h[14], h[15], h[16], h[17]]);
        let segments = h[26] as usize;
        let Some(table) = bytes.get(at + 27..at + 27 + segments) else {
            break;
        };
        let mut data = at + 27 + segments;
        let page_end = data + table.iter().map(|&l| l as usize).sum::<usize>();
        let i = match streams.iter().position(|s| s.serial == serial) {
            Some(i) => i,
            None => {
                streams.push(Stream {
                    serial,
                    packet: Vec::new(),
                    packet_at: data,
                    done: 0,
                });
                streams.len() - 1
            }
        };
        let s = &mut streams[i];
        for &lace in table {
            if s.done >= 2 {
                break;
            }
            if s.packet.is_empty() {
                s.packet_at = data;
            }
            let end = (data + lace as usize).min(bytes.len());
            s.packet
                .extend_from_slice(bytes.get(data..end).unwrap_or_default());
            data += lace as usize;
            if lace < 255 {
                s.done += 1;
                if s.done == 2 {
                    let (kind, skip) = if s.packet.starts_with(b"\x03vorbis") {
                        ("Vorbis", 7)
                    } else if s.packet.starts_with(b"OpusTags") {
                        ("Opus", 8)
                    } else {
                        ("", 0)
                    };
                    if skip > 0 {
                        vorbis_comments(&s.packet[skip..]).map_err(|o| {
                            overrun(
                                format!(
                                    "the Ogg {kind} comment packet (from byte {})",
                                    s.packet_at
                                ),
                                0,
                                Overrun {
                                    at: o.at + skip,
                                    ..o
                                },
                            )
                        })?;
                    }
                }
                s.packet.clear();
            }
        }
        if streams.iter().all(|s| s.done >= 2) {
            break;
        }
        at = page_end;
    }
    Ok(())
}

/// An ID3v2.3 tag's frames give 32-bit sizes (v2.2's are 24-bit and v2.4's 28-bit, both
/// under what one allocation may ask for); each must fit in what is left of the tag.
fn check_id3v2(bytes: &[u8], start: usize) -> Result<(), Error> {
    let Some(h) = bytes.get(start..start + 10) else {
        return Ok(());
    };
    let (major, flags) = (h[3], h[5]);
    if major != 3 {
        return Ok(());
    }
    let size = h[6..10]
        .iter()
        .fold(0usize, |n, &b| (n << 7) | (b & 0x7f) as usize);
    let body_at = start + 10;
    let raw = bytes
        .get(body_at..(body_at + size).min(bytes.len()))
        .unwrap_or_default();
    // With the unsynchronisation flag, symphonia reads v2.3 frames from the decoded tag (each
    // 0xFF 0x00 stands for 0xFF), so offsets are in the decoded bytes.
    let unsync = flags & 0x80 != 0;
    let body: std::borrow::Cow<[u8]> = if unsync {
        let mut out = Vec::with_capacity(raw.len());
        let mut prev = 0u8;
        for &b in raw {
            if !(prev == 0xff && b == 0) {
                out.push(b);
            }
            prev = b;
        }
        out.into()
    } else {
        raw.into()
    };
    let mut at = 0;
    if flags & 0x40 != 0 {
        // The extended header: its size (6 or 10; symphonia refuses others) then that much.
        match be32(&body, 0) {
            Some(n @ (6 | 10)) => at = 4 + n as usize,
            _ => return Ok(()),
        }
    }
    while let Some(id) = body.get(at..at + 4) {
        if !id
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            break; // padding
        }
        let frame = String::from_utf8_lossy(id).into_owned();
        let Some(len) = be32(&body, at + 4) else {
            break;
        };
        let left = body.len().saturating_sub(at + 10);
        if len as usize > left {
            let place = if unsync {
                format!("byte {} of the decoded tag", at + 4)
            } else {
                format!("byte {}", body_at + at + 4)
            };
            return Err(Error::operator(format!(
                "{OP}: the ID3v2.3 frame {frame} (tag at byte {start}) gives a length of {len} \
                 bytes at {place}, more than the {left} left in the tag"
            )));
        }
        at += 10 + len as usize;
    }
    Ok(())
}
