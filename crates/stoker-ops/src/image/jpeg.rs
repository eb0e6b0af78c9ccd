//! JPEG through libjpeg-turbo's TurboJPEG 3 API (`turbojpeg-sys`, built from the bundled
//! sources with SIMD), with what the safe `turbojpeg` crate does not expose: DCT-domain
//! scaling (M/8), decoding a region only, a pixel limit checked from the header, and a
//! scan limit against progressive-JPEG denial of service.
//!
//! Every call uses a fresh decompressor handle, so nothing leaks from one image to the
//! next.
//!
//! Marker scanning (EXIF orientation, the Adobe APP14 marker of inverted CMYK files) is a
//! small bounded parser over the bytes before the first scan.

use std::ffi::CStr;

use stoker_core::{Error, Tensor};
use turbojpeg_sys as tj;

use super::decode::{ColorMode, DecodeImage};
use super::hwc_tensor;

/// A DCT-domain scaling factor `eighths / 8`, `eighths` in `1..=16`. libjpeg-turbo scales
/// while it transforms, so a 1/2 decode costs well under half a full one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DctScale {
    eighths: u8,
}

impl DctScale {
    /// No scaling.
    pub const FULL: DctScale = DctScale { eighths: 8 };

    /// `eighths / 8`; `None` outside `1..=16`.
    pub fn new(eighths: u8) -> Option<DctScale> {
        (1..=16).contains(&eighths).then_some(DctScale { eighths })
    }

    /// The numerator over 8.
    pub fn eighths(self) -> u8 {
        self.eighths
    }

    /// The factor as a number.
    pub fn factor(self) -> f64 {
        self.eighths as f64 / 8.0
    }

    /// A dimension after scaling (libjpeg rounds up).
    pub fn scaled(self, dim: usize) -> usize {
        (dim * self.eighths as usize).div_ceil(8)
    }

    fn reduced(self) -> tj::tjscalingfactor {
        let (mut a, mut b) = (self.eighths as i32, 8i32);
        let g = gcd(a, b);
        a /= g;
        b /= g;
        tj::tjscalingfactor { num: a, denom: b }
    }
}

fn gcd(mut a: i32, mut b: i32) -> i32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A region of the *scaled* image to decode: `x`, `y`, `w`, `h` in scaled pixels. `x` is
/// aligned down to the scaled iMCU width by [`decode_jpeg`], which reports the region it
/// actually decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegRegion {
    /// Left edge.
    pub x: usize,
    /// Top edge.
    pub y: usize,
    /// Width.
    pub w: usize,
    /// Height.
    pub h: usize,
}

/// What the JPEG header says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JpegHeader {
    pub width: usize,
    pub height: usize,
    /// TJSAMP_* (-1: unknown, no cropping).
    pub subsamp: i32,
    /// TJCS_*.
    pub colorspace: i32,
    pub lossless: bool,
}

impl JpegHeader {
    /// The scaled iMCU width: region x offsets must be multiples of it.
    pub fn scaled_mcu_width(&self, scale: DctScale) -> Option<usize> {
        let mcu = match self.subsamp as tj::TJSAMP {
            tj::TJSAMP_TJSAMP_444 | tj::TJSAMP_TJSAMP_GRAY | tj::TJSAMP_TJSAMP_440 => 8,
            tj::TJSAMP_TJSAMP_422 | tj::TJSAMP_TJSAMP_420 => 16,
            tj::TJSAMP_TJSAMP_411 => 32,
            tj::TJSAMP_TJSAMP_441 => 8,
            _ => return None,
        };
        Some(scale.scaled(mcu))
    }

    /// The iMCU height in source pixels.
    pub fn mcu_height(&self) -> usize {
        match self.subsamp as tj::TJSAMP {
            tj::TJSAMP_TJSAMP_420 | tj::TJSAMP_TJSAMP_440 => 16,
            tj::TJSAMP_TJSAMP_441 => 32,
            _ => 8,
        }
    }

    pub fn is_cmyk(&self) -> bool {
        matches!(
            self.colorspace as tj::TJCS,
            tj::TJCS_TJCS_CMYK | tj::TJCS_TJCS_YCCK
        )
    }
}

struct Decompressor(tj::tjhandle);

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

/// Runs `f` with a fresh decompressor. Creating one costs about a microsecond (against
/// milliseconds for a decode), and a fresh one carries nothing over from another image:
/// libjpeg keeps Huffman/quantisation tables and the frame of the previous image in a
/// reused handle, and after some errors it keeps failing.
fn with_decompressor<R>(f: impl FnOnce(&Decompressor) -> Result<R, Error>) -> Result<R, Error> {
    f(&Decompressor::new()?)
}

/// libjpeg's warning for data that ends before the image does.
const PREMATURE_END: &str = "Premature end of JPEG file";

impl Decompressor {
    fn new() -> Result<Decompressor, Error> {
        // SAFETY: plain constructor; null on failure.
        let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if h.is_null() {
            return Err(Error::operator(
                "decode_jpeg: cannot create a TurboJPEG decompressor",
            ));
        }
        let d = Decompressor(h);
        // Progressive files with thousands of scans are a known denial of service; no
        // real encoder writes more than a few dozen.
        d.set(tj::TJPARAM_TJPARAM_SCANLIMIT, 500)?;
        Ok(d)
    }

    fn error_message(&self) -> String {
        // SAFETY: returns a pointer to a NUL-terminated string owned by the handle.
        unsafe {
            let p = tj::tj3GetErrorStr(self.0);
            if p.is_null() {
                "unknown TurboJPEG error".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    fn is_warning(&self) -> bool {
        // SAFETY: valid handle.
        unsafe { tj::tj3GetErrorCode(self.0) == tj::TJERR_TJERR_WARNING as i32 }
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), Error> {
        // SAFETY: valid handle; unknown parameters return -1.
        if unsafe { tj::tj3Set(self.0, param as i32, value) } != 0 {
            return Err(Error::operator(format!(
                "decode_jpeg: {}",
                self.error_message()
            )));
        }
        Ok(())
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: valid handle.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }

    fn header(&self, data: &[u8]) -> Result<JpegHeader, Error> {
        if data.is_empty() {
            return Err(Error::operator("decode_jpeg: empty input"));
        }
        // libjpeg takes a stream without a frame header for a tables-only stream and
        // keeps the previous image's frame; refuse it here.
        if !scan_markers(data).frame {
            return Err(Error::operator(
                "decode_jpeg: no frame header before the first scan (truncated, or a \
                 tables-only stream)",
            ));
        }
        // SAFETY: data is a valid slice for its length.
        let rc =
            unsafe { tj::tj3DecompressHeader(self.0, data.as_ptr(), data.len() as tj::size_t) };
        if rc != 0 {
            return Err(Error::operator(format!(
                "decode_jpeg: bad header: {}",
                self.error_message()
            )));
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(Error::operator(
                "decode_jpeg: no frame header (truncated, or a tables-only stream)",
            ));
        }
        let precision = self.get(tj::TJPARAM_TJPARAM_PRECISION);
        if precision != 8 {
            return Err(Error::operator(format!(
                "decode_jpeg: {precision}-bit JPEG is not supported (8-bit only)"
            )));
        }
        Ok(JpegHeader {
            width: width as usize,
            height: height as usize,
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            colorspace: self.get(tj::TJPARAM_TJPARAM_COLORSPACE),
            lossless: self.get(tj::TJPARAM_TJPARAM_LOSSLESS) == 1,
        })
    }

    /// Decodes into `out` (resized to the image; a fresh buffer is zeroed, a reused one
    /// is overwritten whole by libjpeg) with `channels` per pixel. The header must have
    /// been read by [`Decompressor::header`] on the same data just before.
    #[allow(clippy::too_many_arguments)]
    fn decompress(
        &self,
        data: &[u8],
        header: &JpegHeader,
        scale: DctScale,
        region: Option<JpegRegion>,
        (pixel_format, channels): (tj::TJPF, usize),
        allow_truncated: bool,
        out: &mut Vec<u8>,
    ) -> Result<(usize, usize), Error> {
        let sf = if header.lossless {
            DctScale::FULL
        } else {
            scale
        };
        // SAFETY: valid handle; the factor is one libjpeg-turbo lists (M/8 reduced).
        if unsafe { tj::tj3SetScalingFactor(self.0, sf.reduced()) } != 0 {
            return Err(Error::operator(format!(
                "decode_jpeg: scale {}/8: {}",
                sf.eighths,
                self.error_message()
            )));
        }
        let (sw, sh) = (sf.scaled(header.width), sf.scaled(header.height));
        let (w, h) = match region {
            Some(r) => {
                let tjr = tj::tjregion {
                    x: r.x as i32,
                    y: r.y as i32,
                    w: r.w as i32,
                    h: r.h as i32,
                };
                // SAFETY: valid handle, header read.
                if unsafe { tj::tj3SetCroppingRegion(self.0, tjr) } != 0 {
                    return Err(Error::operator(format!(
                        "decode_jpeg: region {r:?} of a {sw}x{sh} image: {}",
                        self.error_message()
                    )));
                }
                (r.w, r.h)
            }
            None => {
                let full = tj::tjregion {
                    x: 0,
                    y: 0,
                    w: 0,
                    h: 0,
                };
                // SAFETY: valid handle; an all-zero region means "uncropped".
                unsafe { tj::tj3SetCroppingRegion(self.0, full) };
                (sw, sh)
            }
        };
        let len = w
            .checked_mul(h)
            .and_then(|n| n.checked_mul(channels))
            .ok_or_else(|| Error::operator("decode_jpeg: image size overflows"))?;
        if out.capacity() == 0 {
            *out = vec![0u8; len];
        } else {
            // Every row is written on success and on the warnings accepted below, except
            // the rows of a truncated file that libjpeg never reaches: zero those as a
            // fresh buffer would be.
            out.resize(len, 0);
            if allow_truncated {
                out.fill(0);
            }
        }
        // SAFETY: `out` holds exactly pitch * h bytes for the (scaled, cropped) output
        // that libjpeg-turbo writes with this pitch and pixel format.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.0,
                data.as_ptr(),
                data.len() as tj::size_t,
                out.as_mut_ptr(),
                (w * channels) as i32,
                pixel_format,
            )
        };
        if rc != 0 {
            let msg = self.error_message();
            // Warnings leave a complete buffer. Like PIL, accept libjpeg's recoverable
            // warnings (extraneous bytes, a bad restart marker) but treat data that ends
            // early as an error unless asked to keep the partial image (PIL's
            // LOAD_TRUNCATED_IMAGES).
            let truncated = msg.contains(PREMATURE_END);
            if !self.is_warning() || (truncated && !allow_truncated) {
                let what = if truncated {
                    "truncated JPEG"
                } else {
                    "bad JPEG"
                };
                return Err(Error::operator(format!("decode_jpeg: {what}: {msg}")));
            }
        }
        Ok((w, h))
    }
}

/// Reads a JPEG header (width, height, sampling) without decoding.
pub(crate) fn read_header(data: &[u8]) -> Result<JpegHeader, Error> {
    with_decompressor(|d| d.header(data))
}

/// Decodes a JPEG at `scale`, optionally only `region` of the scaled image, into an HWC
/// u8 tensor, per `options` (colour mode, pixel limit, truncation policy; EXIF
/// orientation is *not* applied here, see [`DecodeImage`]).
///
/// Only the rows and iMCU columns around the region are decoded (libjpeg-turbo starts a
/// row at an iMCU boundary, so the decoded superset is aligned and one iMCU wider on each
/// side); the result is cut to exactly the region, clamped to the image, and its pixels
/// equal those of a whole decode at the same scale. The returned region is the clamped
/// one.
pub fn decode_jpeg(
    data: &[u8],
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
) -> Result<(Tensor, JpegRegion), Error> {
    decode_jpeg_charged(data, options, scale, region, &mut |_| Ok(()))
}

/// [`decode_jpeg`], calling `charge` with what the decode will allocate
/// ([`decode_bytes`], the cut included) once the header is read, before any pixel buffer
/// is allocated; an error from `charge` is returned as it is.
pub(crate) fn decode_jpeg_charged(
    data: &[u8],
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
    charge: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<(Tensor, JpegRegion), Error> {
    let markers = scan_markers(data);
    with_decompressor(|d| {
        let header = d.header(data)?;
        check_pixels(&header, options.max_pixels)?;
        charge(decode_bytes(
            &header, &markers, options, scale, region, true,
        )?)?;
        decode_with(d, data, &header, &markers, options, scale, region)
    })
}

/// An upper bound of the bytes a decode of `region` (or all) at `scale` allocates:
/// libjpeg's own buffers (a progressive file's coefficients, two bytes per sample of the
/// whole image whatever the scale; else a few rows of MCUs), the decoded superset of the
/// region (a CMYK file's four channels and their conversion), and with `cut` the region
/// cut out of it. From the header alone.
pub(crate) fn decode_bytes(
    header: &JpegHeader,
    markers: &Markers,
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
    cut: bool,
) -> Result<u64, Error> {
    let scale = if header.lossless {
        DctScale::FULL
    } else {
        scale
    };
    let (want, superset) = regions(header, scale, region)?;
    let c = if options.mode == ColorMode::Gray {
        1
    } else {
        3
    };
    let px = |r: JpegRegion| (r.w * r.h) as u64;
    let decoded = if header.is_cmyk() {
        px(superset) * (4 + 3 + c)
    } else {
        px(superset) * c
    };
    let cut = if cut && want != superset {
        px(want) * c
    } else {
        0
    };
    let (w, h) = (header.width as u64, header.height as u64);
    // Samples per pixel at the components' resolutions.
    let per_px2 = match header.subsamp as tj::TJSAMP {
        tj::TJSAMP_TJSAMP_GRAY => 2,
        tj::TJSAMP_TJSAMP_420 | tj::TJSAMP_TJSAMP_411 | tj::TJSAMP_TJSAMP_441 => 3,
        tj::TJSAMP_TJSAMP_422 | tj::TJSAMP_TJSAMP_440 => 4,
        _ if header.is_cmyk() => 8,
        _ => 6,
    };
    let internal = if markers.progressive {
        // 2-byte coefficients; `per_px2` counts half samples.
        w * h * per_px2
    } else {
        // Row buffers: a few iMCU rows of every component, and the context rows of fancy
        // upsampling.
        w * 64 * 4 * 2
    };
    Ok(decoded + cut + internal + 64 * 1024)
}

/// The region asked for (clamped to the `scale`d image) and the superset of it that
/// libjpeg decodes (see [`decode_into`]).
pub(crate) fn regions(
    header: &JpegHeader,
    scale: DctScale,
    region: Option<JpegRegion>,
) -> Result<(JpegRegion, JpegRegion), Error> {
    let (sw, sh) = (scale.scaled(header.width), scale.scaled(header.height));
    let full = JpegRegion {
        x: 0,
        y: 0,
        w: sw,
        h: sh,
    };
    // `want`: the region asked for (clamped); `superset`: what libjpeg decodes. Its left
    // edge must sit on an iMCU boundary, and libjpeg's fancy upsampling treats the edges
    // of a cropped decode as image edges, so the superset reaches one iMCU beyond the
    // wanted region on every side (where the image allows). The cut out of it is then
    // pixel-identical to the same region of a whole decode.
    Ok(match region {
        None => (full, full),
        Some(r) => {
            if r.w == 0 || r.h == 0 || r.x >= sw || r.y >= sh {
                return Err(Error::operator(format!(
                    "decode_jpeg: region {r:?} is empty or outside the {sw}x{sh} image"
                )));
            }
            let want = JpegRegion {
                x: r.x,
                y: r.y,
                w: (r.x + r.w).min(sw) - r.x,
                h: (r.y + r.h).min(sh) - r.y,
            };
            let mh = scale.scaled(header.mcu_height());
            let y0 = want.y.saturating_sub(mh);
            let y1 = (want.y + want.h + mh).min(sh);
            let superset = match header.scaled_mcu_width(scale) {
                // Lossless JPEG cannot be partially decoded: decode it all, then cut.
                _ if header.lossless => full,
                Some(m) => {
                    let x0 = want.x.saturating_sub(m) / m * m;
                    let x1 = (want.x + want.w + m).min(sw);
                    JpegRegion {
                        x: x0,
                        y: y0,
                        w: x1 - x0,
                        h: y1 - y0,
                    }
                }
                // Unknown sampling: libjpeg-turbo refuses any cropping region ("Could not
                // determine subsampling level", found by fuzz/image_decode), rows too:
                // decode it all, then cut.
                None => full,
            };
            (want, superset)
        }
    })
}

pub(crate) fn check_pixels(header: &JpegHeader, max_pixels: u64) -> Result<(), Error> {
    let px = header.width as u64 * header.height as u64;
    if px > max_pixels {
        return Err(Error::operator(format!(
            "decode_jpeg: {}x{} image ({px} pixels) exceeds the limit of {max_pixels} \
             pixels (a decompression bomb?)",
            header.width, header.height
        )));
    }
    Ok(())
}

/// Decodes with an already-read header.
fn decode_with(
    d: &Decompressor,
    data: &[u8],
    header: &JpegHeader,
    markers: &Markers,
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
) -> Result<(Tensor, JpegRegion), Error> {
    let mut px = Vec::new();
    let (want, superset, c) =
        decode_into(d, data, header, markers, options, scale, region, &mut px)?;
    let px = if superset == want {
        px
    } else {
        let stride = superset.w * c;
        let dx = (want.x - superset.x) * c;
        let mut out = Vec::with_capacity(want.w * want.h * c);
        for y in want.y - superset.y..want.y - superset.y + want.h {
            out.extend_from_slice(&px[y * stride + dx..y * stride + dx + want.w * c]);
        }
        out
    };
    Ok((hwc_tensor(want.h, want.w, c, px)?, want))
}

/// Decodes `region` (or all) of a JPEG whose header is `header` into `buf`, for a caller
/// that only reads the pixels (the fused crop: `buf` is a reused scratch buffer, so no
/// allocation, zeroing or page faults per image). Returns the region asked for (clamped
/// to the image), the region `buf` holds (a superset of it, row-major, `c` channels)
/// and `c`.
pub(crate) fn decode_region_into(
    data: &[u8],
    header: &JpegHeader,
    markers: &Markers,
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
    buf: &mut Vec<u8>,
) -> Result<(JpegRegion, JpegRegion, usize), Error> {
    with_decompressor(|d| {
        d.header(data)?;
        decode_into(d, data, header, markers, options, scale, region, buf)
    })
}

#[allow(clippy::too_many_arguments)]
fn decode_into(
    d: &Decompressor,
    data: &[u8],
    header: &JpegHeader,
    markers: &Markers,
    options: &DecodeImage,
    scale: DctScale,
    region: Option<JpegRegion>,
    buf: &mut Vec<u8>,
) -> Result<(JpegRegion, JpegRegion, usize), Error> {
    let scale = if header.lossless {
        DctScale::FULL
    } else {
        scale
    };
    let (want, superset) = regions(header, scale, region)?;
    let full = JpegRegion {
        x: 0,
        y: 0,
        w: scale.scaled(header.width),
        h: scale.scaled(header.height),
    };
    let crop = (superset != full).then_some(superset);
    let gray = options.mode == ColorMode::Gray;
    let c = if header.is_cmyk() {
        let mut cmyk = Vec::new();
        d.decompress(
            data,
            header,
            scale,
            crop,
            (tj::TJPF_TJPF_CMYK, 4),
            options.allow_truncated,
            &mut cmyk,
        )?;
        let rgb = cmyk_to_rgb(&cmyk, markers.adobe);
        if gray {
            *buf = rgb_to_gray(&rgb);
            1
        } else {
            *buf = rgb;
            3
        }
    } else {
        let (pf, c) = if gray {
            (tj::TJPF_TJPF_GRAY, 1)
        } else {
            (tj::TJPF_TJPF_RGB, 3)
        };
        d.decompress(
            data,
            header,
            scale,
            crop,
            (pf, c),
            options.allow_truncated,
            buf,
        )?;
        c
    };
    Ok((want, superset, c))
}

/// CMYK to RGB the way PIL converts: Adobe files store inverted ink values (PIL reads
/// them as `CMYK;I`), then each channel is `(255 - ink) * (255 - K) / 255`, rounded.
fn cmyk_to_rgb(px: &[u8], adobe_inverted: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(px.len() / 4 * 3);
    let muldiv255 = |a: u32, b: u32| {
        let x = a * b + 128;
        ((x + (x >> 8)) >> 8) as u8
    };
    for p in px.chunks_exact(4) {
        let (c, m, y, k) = if adobe_inverted {
            (255 - p[0], 255 - p[1], 255 - p[2], 255 - p[3])
        } else {
            (p[0], p[1], p[2], p[3])
        };
        let nk = 255 - k as u32;
        for ink in [c, m, y] {
            out.push(muldiv255(255 - ink as u32, nk));
        }
    }
    out
}

/// PIL's `convert("L")`: ITU-R 601-2 luma in 16-bit fixed point, rounded.
pub(crate) fn rgb_to_gray(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| luma(p[0], p[1], p[2]))
        .collect()
}

#[inline]
pub(crate) fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((r as u32 * 19595 + g as u32 * 38470 + b as u32 * 7471 + 0x8000) >> 16) as u8
}

/// What the markers before the first scan say.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Markers {
    /// EXIF orientation (1..=8), if present and valid.
    pub orientation: Option<u8>,
    /// An Adobe APP14 marker is present (CMYK values stored inverted).
    pub adobe: bool,
    /// A frame header (SOFn) precedes the first scan.
    pub frame: bool,
    /// The frame is progressive (SOF2, SOF6, SOF10, SOF14): libjpeg keeps the whole
    /// image's coefficients while it decodes.
    pub progressive: bool,
}

/// Scans JPEG markers up to the first scan. Never fails: anything unexpected ends the scan
/// (libjpeg reports real errors).
pub(crate) fn scan_markers(data: &[u8]) -> Markers {
    let mut m = Markers::default();
    if data.len() < 4 || data[0] != 0xFF || data[1] != 0xD8 {
        return m;
    }
    let mut i = 2;
    while i + 4 <= data.len() {
        if data[i] != 0xFF {
            break;
        }
        let marker = data[i + 1];
        if marker == 0xFF {
            i += 1; // fill byte
            continue;
        }
        if marker == 0xD8 || marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            i += 2;
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            break;
        }
        let len = u16::from_be_bytes([data[i + 2], data[i + 3]]) as usize;
        if len < 2 || i + 2 + len > data.len() {
            break;
        }
        let body = &data[i + 4..i + 2 + len];
        if marker == 0xE1 && body.starts_with(b"Exif\0\0") && m.orientation.is_none() {
            m.orientation = exif_orientation(&body[6..]);
        } else if marker == 0xEE && body.starts_with(b"Adobe") {
            m.adobe = true;
        } else if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            m.frame = true;
            m.progressive |= matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE);
        }
        i += 2 + len;
    }
    m
}

/// The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block.
pub(crate) fn exif_orientation(tiff: &[u8]) -> Option<u8> {
    let le = match tiff.get(..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let u16_at = |o: usize| -> Option<u16> {
        let b: [u8; 2] = tiff.get(o..o + 2)?.try_into().ok()?;
        Some(if le {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |o: usize| -> Option<u32> {
        let b: [u8; 4] = tiff.get(o..o + 4)?.try_into().ok()?;
        Some(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    if u16_at(2)? != 42 {
        return None;
    }
    let ifd = u32_at(4)? as usize;
    let n = u16_at(ifd)? as usize;
    for e in 0..n.min(512) {
        let at = ifd + 2 + e * 12;
        if u16_at(at)? == 0x0112 {
            // Type SHORT (3), count 1: the value sits in the first two bytes.
            if u16_at(at + 2)? != 3 {
                return None;
            }
            let v = u16_at(at + 8)?;
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

/// Encodes an 8-bit RGB image (`height` rows of `width * 3` bytes) as a baseline JPEG with
/// 4:2:0 chroma subsampling at `quality` (1-100), as cameras and most datasets store them.
/// For generating test and demo data; the pipelines only decode.
pub fn encode_jpeg(rgb: &[u8], width: usize, height: usize, quality: u8) -> Result<Vec<u8>, Error> {
    if width == 0 || height == 0 || rgb.len() != width * height * 3 {
        return Err(Error::operator(format!(
            "encode_jpeg: {} bytes is not a {width}x{height} RGB image",
            rgb.len()
        )));
    }
    if !(1..=100).contains(&quality) {
        return Err(Error::operator(format!(
            "encode_jpeg: quality {quality} is not in 1-100"
        )));
    }
    let (Ok(w), Ok(h), Ok(pitch)) = (
        i32::try_from(width),
        i32::try_from(height),
        i32::try_from(width * 3),
    ) else {
        return Err(Error::operator(format!(
            "encode_jpeg: {width}x{height} is too large"
        )));
    };
    struct Compressor(tj::tjhandle);
    impl Drop for Compressor {
        fn drop(&mut self) {
            // SAFETY: the handle came from tj3Init and is destroyed once.
            unsafe { tj::tj3Destroy(self.0) }
        }
    }
    // SAFETY: plain constructor; null on failure.
    let c = Compressor(unsafe { tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as i32) });
    if c.0.is_null() {
        return Err(Error::operator(
            "encode_jpeg: cannot create a TurboJPEG compressor",
        ));
    }
    let fail = |what: &str| {
        // SAFETY: a valid handle; the message is NUL-terminated and owned by it.
        let msg = unsafe {
            let p = tj::tj3GetErrorStr(c.0);
            if p.is_null() {
                "unknown TurboJPEG error".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error::operator(format!("encode_jpeg: {what}: {msg}"))
    };
    // SAFETY: a valid handle; the parameters and values are TurboJPEG's.
    unsafe {
        if tj::tj3Set(c.0, tj::TJPARAM_TJPARAM_QUALITY as i32, i32::from(quality)) != 0
            || tj::tj3Set(
                c.0,
                tj::TJPARAM_TJPARAM_SUBSAMP as i32,
                tj::TJSAMP_TJSAMP_420,
            ) != 0
        {
            return Err(fail("cannot set the quality"));
        }
    }
    let mut buf: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: `rgb` holds `h` rows of `pitch` bytes (checked above); TurboJPEG allocates
    // `buf`, which is copied and then freed with tj3Free whatever the outcome.
    unsafe {
        let rc = tj::tj3Compress8(
            c.0,
            rgb.as_ptr(),
            w,
            pitch,
            h,
            tj::TJPF_TJPF_RGB,
            &mut buf,
            &mut size,
        );
        let out = (rc == 0 && !buf.is_null())
            .then(|| std::slice::from_raw_parts(buf, size as usize).to_vec());
        if !buf.is_null() {
            tj::tj3Free(buf.cast());
        }
        out.ok_or_else(|| fail("cannot compress"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiff_with_orientation(le: bool, v: u16) -> Vec<u8> {
        let w16 = |x: u16| if le { x.to_le_bytes() } else { x.to_be_bytes() };
        let w32 = |x: u32| if le { x.to_le_bytes() } else { x.to_be_bytes() };
        let mut t = Vec::new();
        t.extend_from_slice(if le { b"II" } else { b"MM" });
        t.extend_from_slice(&w16(42));
        t.extend_from_slice(&w32(8));
        t.extend_from_slice(&w16(1));
        t.extend_from_slice(&w16(0x0112));
        t.extend_from_slice(&w16(3));
        t.extend_from_slice(&w32(1));
        t.extend_from_slice(&w16(v));
        t.extend_from_slice(&[0, 0]);
        t.extend_from_slice(&w32(0));
        t
    }

    #[test]
    fn exif_orientation_both_byte_orders() {
        assert_eq!(exif_orientation(&tiff_with_orientation(true, 6)), Some(6));
        assert_eq!(exif_orientation(&tiff_with_orientation(false, 8)), Some(8));
        assert_eq!(exif_orientation(&tiff_with_orientation(true, 9)), None);
        let t = tiff_with_orientation(true, 3);
        for cut in 0..t.len() {
            // Truncated blocks never panic; they only lose the tag.
            let _ = exif_orientation(&t[..cut]);
        }
        assert_eq!(exif_orientation(&t[..t.len() - 6]), Some(3));
        assert_eq!(exif_orientation(&t[..19]), None);
    }

    #[test]
    fn markers_survive_garbage() {
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00];
        assert_eq!(scan_markers(&j).orientation, None);
        j.extend_from_slice(&[0x40; 3]);
        let _ = scan_markers(&j);
        assert!(!scan_markers(&[]).adobe);
    }

    #[test]
    fn scale_factors_reduce_and_round_up() {
        let s = DctScale::new(4).unwrap();
        let r = s.reduced();
        assert_eq!((r.num, r.denom), (1, 2));
        assert_eq!(s.scaled(101), 51);
        assert_eq!(DctScale::new(3).unwrap().scaled(10), 4);
        assert!(DctScale::new(0).is_none() && DctScale::new(17).is_none());
    }

    #[test]
    fn cmyk_conversion_inverts_adobe() {
        // Plain: C=0, M=255, Y=0, K=0 -> magenta.
        assert_eq!(cmyk_to_rgb(&[0, 255, 0, 0], false), vec![255, 0, 255]);
        // Adobe-inverted storage of the same colour.
        assert_eq!(cmyk_to_rgb(&[255, 0, 255, 255], true), vec![255, 0, 255]);
        // Black ink dominates.
        assert_eq!(cmyk_to_rgb(&[10, 20, 30, 255], false), vec![0, 0, 0]);
        // Values PIL 13 gives for the same CMYK pixels.
        assert_eq!(cmyk_to_rgb(&[10, 20, 30, 40], false), vec![207, 198, 190]);
        assert_eq!(cmyk_to_rgb(&[200, 100, 50, 25], false), vec![50, 140, 185]);
    }

    #[test]
    fn an_encoded_image_decodes_to_nearly_the_same_pixels() {
        let (w, h) = (67, 45);
        // A smooth gradient, different in each channel.
        let rgb: Vec<u8> = (0..w * h * 3)
            .map(|i| ((i / 3 % w) * 2 + i / 3 / w + i % 3 * 20) as u8)
            .collect();
        let jpg = encode_jpeg(&rgb, w, h, 95).unwrap();
        assert_eq!(&jpg[..2], &[0xFF, 0xD8]);
        let (t, _) = decode_jpeg(&jpg, &DecodeImage::default(), DctScale::FULL, None).unwrap();
        assert_eq!(t.shape(), &[h, w, 3]);
        let got = t.data();
        let err: Vec<i32> = got
            .iter()
            .zip(&rgb)
            .map(|(a, b)| (*a as i32 - *b as i32).abs())
            .collect();
        let mean = err.iter().sum::<i32>() as f64 / err.len() as f64;
        assert!(mean < 2.0 && err.iter().all(|e| *e < 16), "mean {mean}");
        assert!(encode_jpeg(&rgb, w, h + 1, 90).is_err());
        assert!(encode_jpeg(&rgb, w, h, 0).is_err());
    }
}
