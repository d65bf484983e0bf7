//! TensorRT's calibration cache text format, as `IInt8Calibrator::writeCalibrationCache`
//! writes it and `trtexec --calib`, Polygraphy's `--calibration-cache` and TensorRT's samples
//! read it:
//!
//! ```text
//! TRT-8601-EntropyCalibration2
//! input: 3c010204
//! /conv1/Conv_output_0: 3d8e2c4a
//! ```
//!
//! The first line names the TensorRT version (`8601` = 8.6.1) and the calibration algorithm;
//! then one line per tensor, `name: hex`, where `hex` is the big-endian IEEE-754 bit pattern of
//! the float32 int8 scale `amax / 127` (so `3c010204` = 1/127: amax 1.0). Tensor names may
//! contain `: `, so a line is split at its last `: `.

use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The TensorRT version written into headers (8.6.1, the version Polygraphy 0.53's docs and
/// most published caches use).
pub const TRT_VERSION_TAG: &str = "8601";

/// A calibration cache: its header line and per-tensor int8 scales in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CalibrationCache {
    /// The first line, e.g. `TRT-8601-EntropyCalibration2`.
    pub header: String,
    /// `(tensor name, scale)` in file order; scale = amax / 127.
    pub scales: Vec<(String, f32)>,
}

impl CalibrationCache {
    pub fn new(header: impl Into<String>) -> CalibrationCache {
        CalibrationCache {
            header: header.into(),
            scales: Vec::new(),
        }
    }

    /// Reads a cache file.
    pub fn read(path: impl AsRef<Path>) -> Result<CalibrationCache> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::data(
                path,
                format!(
                    "not a text calibration cache (invalid UTF-8 at byte {})",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        CalibrationCache::parse(&text, path)
    }

    /// Parses cache text; `path` names the source in errors (`file: line N: ...`).
    pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<CalibrationCache> {
        let path = path.as_ref();
        let err = |line: usize, msg: String| Error::data(path, format!("line {line}: {msg}"));
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end()));
        let header = loop {
            match lines.next() {
                Some((_, "")) => continue,
                Some((n, h)) => {
                    if !h.starts_with("TRT-") || h.contains(": ") {
                        return Err(err(
                            n,
                            format!(
                                "expected a TensorRT calibration cache header such as \
                                 'TRT-{TRT_VERSION_TAG}-EntropyCalibration2', found '{}'",
                                clip(h)
                            ),
                        ));
                    }
                    break h.to_string();
                }
                None => {
                    return Err(Error::data(
                        path,
                        "empty calibration cache (expected a header such as \
                         'TRT-8601-EntropyCalibration2' and 'tensor: hexscale' lines)",
                    ))
                }
            }
        };
        let mut scales: Vec<(String, f32)> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (n, line) in lines {
            if line.is_empty() {
                continue;
            }
            let Some((name, hex)) = line.rsplit_once(": ") else {
                return Err(err(
                    n,
                    format!("expected 'tensor_name: hexscale', found '{}'", clip(line)),
                ));
            };
            if name.is_empty() {
                return Err(err(n, "empty tensor name".into()));
            }
            let hex = hex.trim();
            if hex.is_empty() || hex.len() > 8 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err(
                    n,
                    format!(
                        "scale of '{name}' must be up to 8 hex digits (the float32 bits, e.g. \
                         3c010204), found '{}'",
                        clip(hex)
                    ),
                ));
            }
            let bits = u32::from_str_radix(hex, 16).map_err(|e| err(n, e.to_string()))?;
            let scale = f32::from_bits(bits);
            if !scale.is_finite() || scale < 0.0 {
                return Err(err(
                    n,
                    format!("scale of '{name}' is {scale} ({hex}); it must be finite and >= 0"),
                ));
            }
            if let Some(first) = seen.insert(name.to_string(), n) {
                return Err(err(
                    n,
                    format!("tensor '{name}' appears twice (also on line {first})"),
                ));
            }
            scales.push((name.to_string(), scale));
        }
        Ok(CalibrationCache { header, scales })
    }

    /// The file text: the header, then `name: %08x` lines, each ending in a newline.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(32 * (self.scales.len() + 1));
        s.push_str(&self.header);
        s.push('\n');
        for (name, scale) in &self.scales {
            s.push_str(name);
            s.push_str(": ");
            s.push_str(&scale_to_hex(*scale));
            s.push('\n');
        }
        s
    }

    /// Writes the cache atomically (temporary file + rename).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if self.header.is_empty() || self.header.contains(['\n', '\r']) {
            return Err(Error::data(
                path,
                "the cache header must be one non-empty line",
            ));
        }
        if let Some((name, _)) = self
            .scales
            .iter()
            .find(|(n, _)| n.is_empty() || n.contains(['\n', '\r']))
        {
            return Err(Error::data(
                path,
                format!("tensor name {name:?} cannot be written to a line-based cache"),
            ));
        }
        crate::data::write_atomic(path, self.to_text().as_bytes())
    }

    /// The int8 scale of a tensor (amax / 127).
    pub fn scale(&self, name: &str) -> Option<f32> {
        self.scales.iter().find(|(n, _)| n == name).map(|&(_, s)| s)
    }

    /// The calibrated range of a tensor: scale · 127.
    pub fn amax(&self, name: &str) -> Option<f32> {
        self.scale(name).map(scale_to_amax)
    }

    /// Every tensor's amax by name.
    pub fn amax_map(&self) -> BTreeMap<String, f32> {
        self.scales
            .iter()
            .map(|(n, s)| (n.clone(), scale_to_amax(*s)))
            .collect()
    }

    /// The algorithm named by the header (`EntropyCalibration2` in
    /// `TRT-8601-EntropyCalibration2`), when the header has that shape.
    pub fn algorithm(&self) -> Option<&str> {
        let rest = self.header.strip_prefix("TRT-")?;
        let (_, algo) = rest.split_once('-')?;
        (!algo.is_empty()).then_some(algo)
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }
}

/// The int8 scale's range: `scale · 127` (TensorRT caches store amax / 127).
pub fn scale_to_amax(scale: f32) -> f32 {
    scale * crate::precision::quant::qmax(crate::precision::Precision::Int8)
}

/// The cache encoding of a scale: the float32's bits, big-endian, as 8 lowercase hex digits.
pub fn scale_to_hex(scale: f32) -> String {
    format!("{:08x}", scale.to_bits())
}

fn clip(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(MAX).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_the_big_endian_float_bits() {
        // Checked with Python: struct.pack('>f', x).hex()
        assert_eq!(scale_to_hex(1.0 / 127.0), "3c010204");
        assert_eq!(scale_to_hex(1.0), "3f800000");
        assert_eq!(scale_to_hex(0.125), "3e000000");
        assert_eq!(scale_to_hex(2e-8), "32abcc77");
        assert_eq!(scale_to_hex(0.0), "00000000");
    }

    #[test]
    fn round_trip_keeps_order_names_and_bits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.cache");
        let cache = CalibrationCache {
            header: "TRT-8601-EntropyCalibration2".into(),
            scales: vec![
                ("input".into(), 1.0 / 127.0),
                ("/layer/Conv_output_0".into(), 0.0523),
                ("scope:name: with colons".into(), 3.5e-5),
                ("a".into(), 0.0),
            ],
        };
        cache.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("TRT-8601-EntropyCalibration2\ninput: 3c010204\n"));
        assert!(text.ends_with("a: 00000000\n"));
        let back = CalibrationCache::read(&path).unwrap();
        assert_eq!(back, cache);
        assert_eq!(back.algorithm(), Some("EntropyCalibration2"));
        assert_eq!(back.scale("scope:name: with colons"), Some(3.5e-5));
        assert_eq!(back.amax("input"), Some(1.0));
        assert_eq!(back.amax_map()["input"], 1.0);
        assert_eq!(back.scale("missing"), None);
    }

    #[test]
    fn parses_what_tensorrt_writes() {
        // TensorRT's sampleINT8 MNIST table (TensorRT 7), with CRLF endings and a blank line.
        let text = "TRT-7000-EntropyCalibration2\r\ndata: 3c008912\r\nconv1: 3c88edfc\r\n\r\n\
                    (Unnamed Layer* 48) [Constant]_output: 3c010a14\r\nshort: 3f8\r\n";
        let c = CalibrationCache::parse(text, "t.cache").unwrap();
        assert_eq!(c.header, "TRT-7000-EntropyCalibration2");
        assert_eq!(c.len(), 4);
        assert_eq!(c.scales[0].0, "data");
        assert_eq!(c.scale("data"), Some(f32::from_bits(0x3c008912)));
        assert_eq!(
            c.scale("(Unnamed Layer* 48) [Constant]_output"),
            Some(f32::from_bits(0x3c010a14))
        );
        // Some writers drop leading zeros; TensorRT parses the number, and so do we.
        assert_eq!(c.scale("short"), Some(f32::from_bits(0x3f8)));
    }

    #[test]
    fn malformed_lines_name_the_file_and_line() {
        let cases = [
            ("", "empty calibration cache"),
            (
                "input: 3c010204\n",
                "line 1: expected a TensorRT calibration cache header",
            ),
            (
                "TRT-8601-MinMaxCalibration\ninput 3c010204\n",
                "line 2: expected 'tensor_name: hexscale'",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: 3c01020g\n",
                "line 2: scale of 'x' must be up to 8 hex digits",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: 3c0102040\n",
                "line 2: scale of 'x'",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: +3c01020\n",
                "line 2: scale of 'x'",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: \n",
                "line 2: expected 'tensor_name: hexscale'",
            ),
            (
                "TRT-8601-MinMaxCalibration\n: 3c010204\n",
                "line 2: empty tensor name",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: 7fc00000\n",
                "line 2: scale of 'x' is NaN",
            ),
            (
                "TRT-8601-MinMaxCalibration\nx: bf800000\n",
                "line 2: scale of 'x' is -1",
            ),
            (
                "TRT-8601-MinMaxCalibration\n\nx: 3c010204\nx: 3c010204\n",
                "line 4: tensor 'x' appears twice (also on line 3)",
            ),
        ];
        for (text, want) in cases {
            let e = CalibrationCache::parse(text, "dir/bad.cache")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("dir/bad.cache: "), "{e}");
            assert!(e.contains(want), "{text:?}: got {e}, want {want}");
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.cache");
        let e = CalibrationCache::read(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.cache"), "{e}");
        std::fs::write(&missing, [0xff, 0xfe, 0x00]).unwrap();
        let e = CalibrationCache::read(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.cache") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn header_only_cache_is_valid_and_bad_names_are_not_written() {
        let c = CalibrationCache::parse("TRT-8601-MinMaxCalibration\n", "x").unwrap();
        assert!(c.is_empty());
        assert_eq!(c.algorithm(), Some("MinMaxCalibration"));
        let dir = tempfile::tempdir().unwrap();
        let mut c = CalibrationCache::new("TRT-8601-MinMaxCalibration");
        c.scales.push(("two\nlines".into(), 1.0));
        let e = c.write(dir.path().join("x.cache")).unwrap_err().to_string();
        assert!(e.contains("x.cache"), "{e}");
    }
}
