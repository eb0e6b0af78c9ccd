//! Decoding JPEG, PNG and WebP bytes into HWC u8 images.

use std::io::Cursor;

use stoker_core::{Error, Tensor};

use super::jpeg::{self, DctScale};
use super::{hwc_tensor, ImageRef};

/// PIL's default `Image.MAX_IMAGE_PIXELS` (a 1024 MiB 24-bit image / 4 / 3).
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// The colour layout a decoder produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ColorMode {
    /// 3 channels; alpha dropped, gray replicated (PIL's `convert("RGB")`).
    #[default]
    Rgb,
    /// 1 channel. JPEG: libjpeg's luma plane (torchvision's `ImageReadMode.GRAY`); other
    /// formats: PIL's `convert("L")` formula.
    Gray,
    /// 4 channels when the file has alpha (PNG, WebP), else 3 as [`ColorMode::Rgb`].
    RgbKeepAlpha,
}

/// Image file formats recognised by their magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageFormat {
    /// JPEG (baseline, progressive, lossless; 8-bit).
    Jpeg,
    /// PNG (1-16 bit, gray, RGB, palette, alpha).
    Png,
    /// WebP (lossy, lossless, alpha; first frame of an animation).
    WebP,
}

impl ImageFormat {
    /// The format from the first bytes, if known.
    pub fn sniff(data: &[u8]) -> Option<ImageFormat> {
        if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else if data.starts_with(b"RIFF") && (data.len() < 12 || &data[8..12] == b"WEBP") {
            // (A RIFF file cut before its form type is taken as a truncated WebP.)
            Some(ImageFormat::WebP)
        } else {
            None
        }
    }
}

/// Options for [`decode_image`]: `DecodeImage::default()` gives RGB, no EXIF rotation,
/// PIL's pixel limit, and an error on truncated data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DecodeImage {
    /// Output colour layout.
    pub mode: ColorMode,
    /// Rotate/flip by the EXIF Orientation tag (JPEG, PNG `eXIf`, WebP `EXIF`). Off by
    /// default, like torchvision's `decode_jpeg` and PIL's `Image.open` (which need
    /// `apply_exif_orientation=True` / `ImageOps.exif_transpose`).
    pub apply_exif_orientation: bool,
    /// Refuse images with more pixels than this, checked from the header before any
    /// pixel buffer is allocated.
    pub max_pixels: u64,
    /// Keep a JPEG whose data ends early (the missing rows are gray), as PIL's
    /// `ImageFile.LOAD_TRUNCATED_IMAGES = True` does. Off: a truncated JPEG is an error.
    pub allow_truncated: bool,
}

impl Default for DecodeImage {
    fn default() -> DecodeImage {
        DecodeImage {
            mode: ColorMode::Rgb,
            apply_exif_orientation: false,
            max_pixels: DEFAULT_MAX_PIXELS,
            allow_truncated: false,
        }
    }
}

impl DecodeImage {
    /// Sets the colour mode.
    pub fn mode(mut self, mode: ColorMode) -> DecodeImage {
        self.mode = mode;
        self
    }

    /// Sets whether to apply EXIF orientation.
    pub fn apply_exif_orientation(mut self, on: bool) -> DecodeImage {
        self.apply_exif_orientation = on;
        self
    }

    /// Sets the pixel limit.
    pub fn max_pixels(mut self, n: u64) -> DecodeImage {
        self.max_pixels = n;
        self
    }

    /// Sets whether a truncated JPEG is kept.
    pub fn allow_truncated(mut self, on: bool) -> DecodeImage {
        self.allow_truncated = on;
        self
    }

    /// Decodes `data` (see [`decode_image`]).
    pub fn apply(&self, data: &[u8]) -> Result<Tensor, Error> {
        decode_image(data, self)
    }

    /// Decodes `data`, calling `charge` with the bytes the decode will allocate (the
    /// frame, the decoder's own buffers, a colour conversion or rotation: an upper bound,
    /// from the header) before it allocates them, see [`decode_image_charged`].
    pub fn apply_charged(
        &self,
        data: &[u8],
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        decode_image_charged(data, self, charge)
    }
}

/// What a header says, without decoding pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The file format.
    pub format: ImageFormat,
    /// Width in pixels (before any EXIF rotation).
    pub width: usize,
    /// Height in pixels (before any EXIF rotation).
    pub height: usize,
}

/// Reads an image's format and size from its header.
pub fn image_info(data: &[u8]) -> Result<ImageInfo, Error> {
    let format = sniff(data)?;
    let (width, height) = match format {
        ImageFormat::Jpeg => {
            let h = jpeg::read_header(data)?;
            (h.width, h.height)
        }
        ImageFormat::Png => {
            let mut d = png::Decoder::new(Cursor::new(data));
            let info = d
                .read_header_info()
                .map_err(|e| Error::operator(format!("decode_png: bad header: {e}")))?;
            (info.width as usize, info.height as usize)
        }
        ImageFormat::WebP => {
            let d = image_webp::WebPDecoder::new(Cursor::new(data))
                .map_err(|e| Error::operator(format!("decode_webp: bad header: {e}")))?;
            let (w, h) = d.dimensions();
            (w as usize, h as usize)
        }
    };
    Ok(ImageInfo {
        format,
        width,
        height,
    })
}

fn sniff(data: &[u8]) -> Result<ImageFormat, Error> {
    if data.is_empty() {
        return Err(Error::operator("decode_image: empty input"));
    }
    ImageFormat::sniff(data).ok_or_else(|| {
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Error::operator(format!(
            "decode_image: not a JPEG, PNG or WebP file (starts with {})",
            head.join(" ")
        ))
    })
}

/// Decodes a JPEG, PNG or WebP file into an `[H, W, C]` u8 tensor.
pub fn decode_image(data: &[u8], options: &DecodeImage) -> Result<Tensor, Error> {
    decode_image_charged(data, options, &mut |_| Ok(()))
}

/// [`decode_image`], calling `charge` with the bytes it is about to allocate before it
/// allocates them: once the header is read (after the pixel limit is checked), an upper
/// bound of the frame, the decoder's own buffers and a colour conversion; and before an
/// EXIF rotation, the rotated copy. Calls add up. An error from `charge` (the memory
/// budget has no room) is returned as it is, before the buffers it was asked for exist.
pub fn decode_image_charged(
    data: &[u8],
    options: &DecodeImage,
    charge: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<Tensor, Error> {
    let (t, orientation) = match sniff(data)? {
        ImageFormat::Jpeg => {
            let markers = jpeg::scan_markers(data);
            let (t, _) = jpeg::decode_jpeg_charged(data, options, DctScale::FULL, None, charge)?;
            (t, markers.orientation)
        }
        ImageFormat::Png => decode_png(data, options, charge)?,
        ImageFormat::WebP => decode_webp(data, options, charge)?,
    };
    match orientation {
        Some(o) if options.apply_exif_orientation && o != 1 => {
            charge(t.data().len() as u64)?;
            orient(&t, o)
        }
        _ => Ok(t),
    }
}

/// The channels [`to_mode`] makes of `c` in `mode`, and whether it copies.
fn mode_channels(c: usize, mode: ColorMode) -> (usize, bool) {
    match (mode, c) {
        (ColorMode::Gray, 1) | (ColorMode::Rgb, 3) | (ColorMode::RgbKeepAlpha, 3 | 4) => (c, false),
        (ColorMode::Gray, _) => (1, true),
        (ColorMode::RgbKeepAlpha, 2) => (4, true),
        _ => (3, true),
    }
}

fn check_limit(op: &str, w: u64, h: u64, max: u64) -> Result<(), Error> {
    if w == 0 || h == 0 {
        return Err(Error::operator(format!(
            "{op}: header declares a {w}x{h} image"
        )));
    }
    if w * h > max {
        return Err(Error::operator(format!(
            "{op}: {w}x{h} image ({} pixels) exceeds the limit of {max} pixels \
             (a decompression bomb?)",
            w * h
        )));
    }
    Ok(())
}

/// What a PNG decoder allocates whatever the image's size (see `decode_png`).
const PNG_DECODER_BYTES: u64 = 640 << 10;

fn decode_png(
    data: &[u8],
    options: &DecodeImage,
    charge: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<(Tensor, Option<u8>), Error> {
    let bad = |e: png::DecodingError| Error::operator(format!("decode_png: {e}"));
    let mut d = png::Decoder::new(Cursor::new(data));
    {
        let info = d.read_header_info().map_err(bad)?;
        check_limit(
            "decode_png",
            info.width as u64,
            info.height as u64,
            options.max_pixels,
        )?;
    }
    // Palette and low bit depths expand to 8 bits; 16-bit samples keep their high byte
    // (PIL's `RGB;16B` raw mode does the same).
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = d.read_info().map_err(bad)?;
    let size = reader.output_buffer_size();
    {
        let (ct, _) = reader.output_color_type();
        let info = reader.info();
        let (w, h) = (info.width as u64, info.height as u64);
        let (out_c, copies) = mode_channels(ct.samples(), options.mode);
        // The frame, the conversion's copy, the decoder's rows (the previous and the
        // current one, raw, up to 8 bytes a pixel), and its fixed state: its read buffer,
        // inflate window and output buffer (531 KiB with png 0.17, whatever the image's
        // size: tests/charges.rs in stoker-pipeline measures it).
        let conv = if copies { w * h * out_c as u64 } else { 0 };
        charge(size as u64 + conv + w * 16 + PNG_DECODER_BYTES)?;
    }
    let mut buf = vec![0u8; size];
    let frame = reader.next_frame(&mut buf).map_err(bad)?;
    buf.truncate(frame.buffer_size());
    let (w, h) = (frame.width as usize, frame.height as usize);
    let src_c = frame.color_type.samples();
    // Rows may be padded in the output (line_size); make them tight.
    let line = frame.line_size;
    if line != w * src_c {
        charge((w * h * src_c) as u64)?;
        let mut tight = Vec::with_capacity(w * h * src_c);
        for y in 0..h {
            tight.extend_from_slice(&buf[y * line..y * line + w * src_c]);
        }
        buf = tight;
    }
    let orientation = reader
        .info()
        .exif_metadata
        .as_deref()
        .and_then(jpeg::exif_orientation);
    Ok((to_mode(buf, h, w, src_c, options.mode)?, orientation))
}

fn decode_webp(
    data: &[u8],
    options: &DecodeImage,
    charge: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<(Tensor, Option<u8>), Error> {
    let bad = |e: image_webp::DecodingError| Error::operator(format!("decode_webp: {e}"));
    let mut d = image_webp::WebPDecoder::new(Cursor::new(data)).map_err(bad)?;
    let (w, h) = d.dimensions();
    check_limit("decode_webp", w as u64, h as u64, options.max_pixels)?;
    let size = d
        .output_buffer_size()
        .ok_or_else(|| Error::operator("decode_webp: image size overflows"))?;
    let c = if d.has_alpha() { 4 } else { 3 };
    {
        let px = w as u64 * h as u64;
        let (out_c, copies) = mode_channels(c, options.mode);
        let conv = if copies { px * out_c as u64 } else { 0 };
        // The frame, the conversion's copy, and the decoder's own planes (lossy: YUV and
        // alpha; lossless: ARGB words), at most four bytes a pixel.
        charge(size as u64 + conv + px * 4 + (64 << 10))?;
    }
    let mut buf = vec![0u8; size];
    d.read_image(&mut buf).map_err(bad)?;
    let orientation = d
        .exif_metadata()
        .ok()
        .flatten()
        .and_then(|e| jpeg::exif_orientation(&e));
    Ok((
        to_mode(buf, h as usize, w as usize, c, options.mode)?,
        orientation,
    ))
}

/// Converts a decoded 1-4 channel buffer to the requested mode.
fn to_mode(buf: Vec<u8>, h: usize, w: usize, c: usize, mode: ColorMode) -> Result<Tensor, Error> {
    let n = h * w;
    let out: (usize, Vec<u8>) = match (mode, c) {
        (ColorMode::Gray, 1) | (ColorMode::Rgb, 3) | (ColorMode::RgbKeepAlpha, 3 | 4) => (c, buf),
        (ColorMode::Gray, 2) => (1, buf.chunks_exact(2).map(|p| p[0]).collect()),
        (ColorMode::Gray, _) => (
            1,
            buf.chunks_exact(c)
                .map(|p| jpeg::luma(p[0], p[1], p[2]))
                .collect(),
        ),
        (ColorMode::Rgb | ColorMode::RgbKeepAlpha, 1) => {
            let mut o = Vec::with_capacity(n * 3);
            for &v in &buf {
                o.extend_from_slice(&[v, v, v]);
            }
            (3, o)
        }
        (ColorMode::Rgb, 2) => {
            let mut o = Vec::with_capacity(n * 3);
            for p in buf.chunks_exact(2) {
                o.extend_from_slice(&[p[0], p[0], p[0]]);
            }
            (3, o)
        }
        (ColorMode::RgbKeepAlpha, 2) => {
            let mut o = Vec::with_capacity(n * 4);
            for p in buf.chunks_exact(2) {
                o.extend_from_slice(&[p[0], p[0], p[0], p[1]]);
            }
            (4, o)
        }
        (_, _) => {
            // Rgb from 4 channels: drop alpha.
            let mut o = Vec::with_capacity(n * 3);
            for p in buf.chunks_exact(c) {
                o.extend_from_slice(&p[..3]);
            }
            (3, o)
        }
    };
    hwc_tensor(h, w, out.0, out.1)
}

/// Applies EXIF orientation `o` (2..=8) like PIL's `ImageOps.exif_transpose`.
pub(crate) fn orient(t: &Tensor, o: u8) -> Result<Tensor, Error> {
    let img = ImageRef::from_tensor(t, "decode_image")?;
    let (h, w, c) = (img.h, img.w, img.c);
    // Orientations 5-8 swap the axes.
    let swap = o >= 5;
    let (oh, ow) = if swap { (w, h) } else { (h, w) };
    let mut out = vec![0u8; img.data.len()];
    for y in 0..oh {
        for x in 0..ow {
            // Source pixel of output (y, x).
            let (sy, sx) = match o {
                2 => (y, w - 1 - x),
                3 => (h - 1 - y, w - 1 - x),
                4 => (h - 1 - y, x),
                5 => (x, y),
                6 => (h - 1 - x, y),
                7 => (h - 1 - x, w - 1 - y),
                8 => (x, w - 1 - y),
                _ => (y, x),
            };
            let s = (sy * w + sx) * c;
            let d = (y * ow + x) * c;
            out[d..d + c].copy_from_slice(&img.data[s..s + c]);
        }
    }
    hwc_tensor(oh, ow, c, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orientations_match_their_definitions() {
        // 2x3 image, one channel, values = index.
        let t = hwc_tensor(2, 3, 1, vec![0, 1, 2, 3, 4, 5]).unwrap();
        let v = |o| {
            let r = orient(&t, o).unwrap();
            (r.shape().to_vec(), r.data().to_vec())
        };
        assert_eq!(v(2), (vec![2, 3, 1], vec![2, 1, 0, 5, 4, 3]));
        assert_eq!(v(3), (vec![2, 3, 1], vec![5, 4, 3, 2, 1, 0]));
        assert_eq!(v(4), (vec![2, 3, 1], vec![3, 4, 5, 0, 1, 2]));
        assert_eq!(v(5), (vec![3, 2, 1], vec![0, 3, 1, 4, 2, 5]));
        // 6: rotate 90 degrees clockwise.
        assert_eq!(v(6), (vec![3, 2, 1], vec![3, 0, 4, 1, 5, 2]));
        assert_eq!(v(7), (vec![3, 2, 1], vec![5, 2, 4, 1, 3, 0]));
        // 8: rotate 90 degrees counter-clockwise.
        assert_eq!(v(8), (vec![3, 2, 1], vec![2, 5, 1, 4, 0, 3]));
    }

    #[test]
    fn unknown_bytes_are_named() {
        let e = decode_image(b"GIF89a....", &DecodeImage::default()).unwrap_err();
        assert!(e.message.starts_with("decode_image: not a JPEG"), "{e}");
        let e = decode_image(b"", &DecodeImage::default()).unwrap_err();
        assert!(e.message.contains("empty"), "{e}");
    }
}
