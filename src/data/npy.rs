//! NumPy `.npy` arrays (the payload of every Polygraphy JSON array) and `.npz` archives.
//!
//! Written by hand rather than through a crate because the format is small and mixprec needs
//! exact control over dtypes (float16, bool, big-endian input) and clear errors per tensor.
//!
//! NumPy has no float8, float4 or 4-bit integer type. mixprec stores them as ONNX Runtime's
//! Python API returns them (and so as `polygraphy run --onnxrt` saves them): float8 and
//! float4e2m1 as their bit patterns in `uint8` arrays, int4 as `int8` and uint4 as `uint8`
//! values. Reading, an array of such bits or values fed to an input declared with a low-bit
//! type is converted by [`as_declared`]; `ml_dtypes` arrays saved with `np.save` (descr `V1`,
//! raw bytes) read as `uint8`. bfloat16 has no `.npy` form and is an error.

use crate::error::{Error, Result};
use crate::graph::ValueInfo;
use crate::tensor::{DType, Tensor, TensorData};
use half::f16;
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The `descr` NumPy writes for a dtype (little-endian, as `np.save` does on x86 and ARM).
fn descr_of(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        // No NumPy type: bit patterns (float8, float4) or values (uint4) in uint8, int4 in int8.
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F4E2M1
        | DType::U4 => "|u1",
        DType::I4 => "|i1",
        // NumPy has no bfloat16 of its own, and strings are not numeric data.
        DType::BF16 | DType::Str => return None,
    })
}

/// Serialises a tensor as an `.npy` file image (format version 1.0).
pub fn to_npy(t: &Tensor) -> std::result::Result<Vec<u8>, String> {
    let descr = descr_of(t.dtype())
        .ok_or_else(|| format!("dtype {} cannot be stored in a .npy array", t.dtype()))?;
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that magic + version + length + header is a multiple of 64, ending in '\n'.
    let total = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(total + 64 + t.len() * t.dtype().size());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    match t.data() {
        TensorData::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::F16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::I8(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::U8(v) => out.extend_from_slice(v),
        TensorData::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        TensorData::Bool(v) => v.iter().for_each(|&x| out.push(x as u8)),
        TensorData::F8E4M3FN(v) => out.extend(v.iter().map(|x| x.to_bits())),
        TensorData::F8E4M3FNUZ(v) => out.extend(v.iter().map(|x| x.to_bits())),
        TensorData::F8E5M2(v) => out.extend(v.iter().map(|x| x.to_bits())),
        TensorData::F8E5M2FNUZ(v) => out.extend(v.iter().map(|x| x.to_bits())),
        TensorData::F4E2M1(v) => out.extend(v.iter().map(|x| x.to_bits())),
        TensorData::U4(v) => out.extend(v.iter().map(|x| x.get())),
        TensorData::I4(v) => out.extend(v.iter().map(|x| x.get() as u8)),
        TensorData::BF16(_) | TensorData::Str(_) => unreachable!("rejected by descr_of"),
    }
    Ok(out)
}

/// Parses an `.npy` file image. Errors are plain text; callers add the file or tensor name.
pub fn from_npy(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a NumPy .npy array (bad magic bytes)".into());
    }
    let major = bytes[6];
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated .npy header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    let header = bytes
        .get(start..start + hlen)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let descr = dict_value(header, "descr").ok_or("the .npy header has no 'descr'")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let fortran = dict_value(header, "fortran_order")
        .ok_or("the .npy header has no 'fortran_order'")?
        .starts_with("True");
    let shape_txt = dict_value(header, "shape").ok_or("the .npy header has no 'shape'")?;
    let shape = parse_shape(shape_txt)?;
    let n: usize = shape.iter().product();
    let body = &bytes[start + hlen..];

    let (order, code) = descr.split_at(1);
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(format!("unsupported .npy dtype '{descr}'")),
    };
    let dtype = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "i2" => DType::I16,
        "u2" => DType::U16,
        "i4" => DType::I32,
        "u4" => DType::U32,
        "i8" => DType::I64,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        // ml_dtypes arrays (float8, int4, ...) saved by np.save: raw one-byte records.
        "V1" => DType::U8,
        _ => {
            return Err(format!(
                "unsupported .npy dtype '{descr}' (numeric and bool arrays only)"
            ))
        }
    };
    let size = dtype.size();
    if body.len() < n * size {
        return Err(format!(
            "truncated .npy data: shape {shape:?} of {} needs {} bytes, found {}",
            dtype,
            n * size,
            body.len()
        ));
    }
    let body = &body[..n * size];
    macro_rules! decode {
        ($t:ty, $w:expr) => {
            body.chunks_exact($w)
                .map(|c| {
                    let a: [u8; $w] = c.try_into().expect("chunk width");
                    if big {
                        <$t>::from_be_bytes(a)
                    } else {
                        <$t>::from_le_bytes(a)
                    }
                })
                .collect()
        };
    }
    let data = match dtype {
        DType::F32 => TensorData::F32(decode!(f32, 4)),
        DType::F64 => TensorData::F64(decode!(f64, 8)),
        DType::F16 => TensorData::F16(decode!(f16, 2)),
        DType::I8 => TensorData::I8(body.iter().map(|&b| b as i8).collect()),
        DType::U8 => TensorData::U8(body.to_vec().into()),
        DType::I16 => TensorData::I16(decode!(i16, 2)),
        DType::U16 => TensorData::U16(decode!(u16, 2)),
        DType::I32 => TensorData::I32(decode!(i32, 4)),
        DType::U32 => TensorData::U32(decode!(u32, 4)),
        DType::I64 => TensorData::I64(decode!(i64, 8)),
        DType::U64 => TensorData::U64(decode!(u64, 8)),
        DType::Bool => TensorData::Bool(body.iter().map(|&b| b != 0).collect()),
        DType::BF16
        | DType::Str
        | DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::U4
        | DType::I4
        | DType::F4E2M1 => unreachable!("not produced above"),
    };
    let t = if fortran && shape.len() > 1 {
        // Column-major data: read it with the reversed shape, then reverse the axes.
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        reverse_axes(Tensor::from_parts(rev, data))
    } else {
        Tensor::from_parts(shape, data)
    };
    Ok(t)
}

/// A loaded array as the low-bit type `to`: `uint8` (or `int8`) bit patterns become float8 /
/// float4e2m1 elements, `int8`/`uint8` values in range become int4/uint4. Other arrays and
/// targets pass through unchanged (the interpreter then checks the dtype).
pub fn as_low_bit(t: Tensor, to: DType) -> std::result::Result<Tensor, String> {
    use crate::lowbit::*;
    if !to.is_low_bit() || t.dtype() == to {
        return Ok(t);
    }
    let bytes: Vec<u8> = match t.data() {
        TensorData::U8(v) => v.to_vec(),
        TensorData::I8(v) => v.iter().map(|&x| x as u8).collect(),
        _ => return Ok(t),
    };
    let vals = t.to_i64_vec().unwrap_or_default();
    let (shape, _) = t.into_parts();
    let range = |lo: i64, hi: i64| -> std::result::Result<(), String> {
        match vals.iter().find(|&&v| v < lo || v > hi) {
            Some(v) => Err(format!("value {v} does not fit {to} ([{lo}, {hi}])")),
            None => Ok(()),
        }
    };
    let data = match to {
        t if t.is_fp8() => crate::tensor::fp8_from_bits(t, &bytes).expect("a float8 type"),
        DType::F4E2M1 => {
            if let Some(b) = bytes.iter().find(|&&b| b > 0xF) {
                return Err(format!("byte {b:#04x} is not a float4e2m1 code (0x0-0xf)"));
            }
            TensorData::F4E2M1(bytes.iter().map(|&b| F4E2M1::from_bits(b)).collect())
        }
        DType::U4 => {
            range(0, 15)?;
            TensorData::U4(vals.iter().map(|&v| U4::wrapping(v)).collect())
        }
        DType::I4 => {
            range(-8, 7)?;
            TensorData::I4(vals.iter().map(|&v| I4::wrapping(v)).collect())
        }
        _ => unreachable!("low-bit types only"),
    };
    Ok(Tensor::from_parts(shape, data))
}

/// Converts the arrays of one loaded feed set whose inputs are declared with a low-bit type
/// ([`as_low_bit`]); an error names the input.
pub fn as_declared(
    feeds: crate::tensor::Feeds,
    inputs: &[ValueInfo],
) -> Result<crate::tensor::Feeds> {
    feeds
        .into_iter()
        .map(|(name, t)| {
            match inputs
                .iter()
                .find(|vi| vi.name == name)
                .and_then(|vi| vi.dtype)
            {
                Some(d) if d.is_low_bit() => {
                    let t = as_low_bit(t, d).map_err(|e| Error::input(&name, e))?;
                    Ok((name, t))
                }
                _ => Ok((name, t)),
            }
        })
        .collect()
}

/// Transposes with the axis order reversed (turns a Fortran-order array into C order).
fn reverse_axes(t: Tensor) -> Tensor {
    let in_shape = t.shape().to_vec();
    let rank = in_shape.len();
    let out_shape: Vec<usize> = in_shape.iter().rev().copied().collect();
    let in_strides = t.strides();
    let n = t.len();
    let mut idx = Vec::with_capacity(n);
    let mut counter = vec![0usize; rank];
    for _ in 0..n {
        // counter indexes the output; output axis k is input axis rank-1-k.
        let off: usize = (0..rank)
            .map(|k| counter[k] * in_strides[rank - 1 - k])
            .sum();
        idx.push(off);
        for k in (0..rank).rev() {
            counter[k] += 1;
            if counter[k] < out_shape[k] {
                break;
            }
            counter[k] = 0;
        }
    }
    Tensor::from_parts(out_shape, t.data().gather(&idx))
}

/// The text of `key`'s value in a Python dict literal (good enough for `.npy` headers).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let k1 = format!("'{key}'");
    let k2 = format!("\"{key}\"");
    let pos = header
        .find(&k1)
        .map(|p| p + k1.len())
        .or_else(|| header.find(&k2).map(|p| p + k2.len()))?;
    let rest = header[pos..].trim_start().strip_prefix(':')?.trim_start();
    if rest.starts_with('(') {
        let end = rest.find(')')?;
        return Some(&rest[..=end]);
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

fn parse_shape(s: &str) -> std::result::Result<Vec<usize>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("bad shape {s} in the .npy header"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("bad shape {s} in the .npy header"))
        })
        .collect()
}

/// Reads every array of an `.npz` archive, in archive order, named without the `.npy` suffix.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::data(path, format!("not a valid .npz (zip) archive: {e}")))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| Error::data(path, format!("entry #{i} of the archive: {e}")))?;
        let name = entry.name().to_string();
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| Error::data(path, format!("array '{name}': {e}")))?;
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        let t = from_npy(&bytes).map_err(|e| Error::data(path, format!("array '{key}': {e}")))?;
        out.push((key, t));
    }
    if out.is_empty() {
        return Err(Error::data(path, "the .npz archive holds no arrays"));
    }
    Ok(out)
}

/// Writes arrays as an `.npz` archive (stored, like `np.savez`), atomically.
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<()> {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(false);
        for (name, t) in arrays {
            let bytes = to_npy(t).map_err(|e| Error::data(path, format!("array '{name}': {e}")))?;
            zip.start_file(format!("{name}.npy"), opts)
                .map_err(|e| Error::data(path, e.to_string()))?;
            zip.write_all(&bytes).map_err(|e| Error::io(path, e))?;
        }
        zip.finish().map_err(|e| Error::data(path, e.to_string()))?;
    }
    super::write_atomic(path, buf.get_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trips_every_numpy_dtype() {
        let tensors = [
            Tensor::from_f32(vec![2, 3], vec![1.0, -2.5, 3.0, 4.0, f32::NAN, 6.0]),
            Tensor::from_i64(vec![], vec![-7]),
            Tensor::from_bool(vec![3], vec![true, false, true]),
            Tensor::from_parts(
                vec![2],
                TensorData::F16(vec![f16::from_f32(1.5), f16::MAX].into()),
            ),
            Tensor::from_parts(vec![1, 2], TensorData::U8(vec![0, 255].into())),
        ];
        for t in tensors {
            let bytes = to_npy(&t).unwrap();
            // The data starts at a multiple of 64, as NumPy requires.
            let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0);
            let back = from_npy(&bytes).unwrap();
            assert_eq!(back.shape(), t.shape());
            assert_eq!(format!("{:?}", back.data()), format!("{:?}", t.data()));
        }
    }

    #[test]
    fn reads_fortran_order_and_big_endian() {
        // np.asfortranarray(np.arange(6, dtype='>i4').reshape(2, 3)): memory order 0 3 1 4 2 5.
        let header = "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }";
        let mut b = MAGIC.to_vec();
        b.extend([1, 0]);
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        for v in [0i32, 3, 1, 4, 2, 5] {
            b.extend(v.to_be_bytes());
        }
        let t = from_npy(&b).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.to_i64_vec().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(from_npy(b"hello world").unwrap_err().contains("magic"));
        let mut b = to_npy(&Tensor::from_f32(vec![4], vec![1.0; 4])).unwrap();
        b.truncate(b.len() - 3);
        assert!(from_npy(&b).unwrap_err().contains("truncated"));
    }

    #[test]
    fn npz_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npz");
        let arrays = vec![
            ("x".to_string(), Tensor::from_f32(vec![2], vec![1.0, 2.0])),
            ("ids".to_string(), Tensor::from_i64(vec![1], vec![3])),
        ];
        write_npz(&p, &arrays).unwrap();
        let back = read_npz(&p).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].0, "x");
        assert_eq!(back[1].1.to_i64_vec().unwrap(), vec![3]);
        std::fs::write(&p, b"not a zip").unwrap();
        assert!(read_npz(&p).unwrap_err().to_string().contains("a.npz"));
    }

    #[test]
    fn low_bit_types_store_as_bytes_and_read_back() {
        use crate::lowbit::{F8E4M3FN, I4};
        let t = Tensor::from_parts(
            vec![2],
            TensorData::F8E4M3FN(
                vec![
                    F8E4M3FN::from_f32(1.0, true),
                    F8E4M3FN::from_f32(-448.0, true),
                ]
                .into(),
            ),
        );
        let back = from_npy(&to_npy(&t).unwrap()).unwrap();
        assert_eq!(back.data(), &TensorData::U8(vec![0x38, 0xFE].into()));
        assert_eq!(as_low_bit(back, DType::F8E4M3FN).unwrap(), t);
        let t = Tensor::from_parts(
            vec![2],
            TensorData::I4(vec![I4::wrapping(-8), I4::wrapping(7)].into()),
        );
        let back = from_npy(&to_npy(&t).unwrap()).unwrap();
        assert_eq!(back.data(), &TensorData::I8(vec![-8, 7].into()));
        assert_eq!(as_low_bit(back, DType::I4).unwrap(), t);
        let e = as_low_bit(
            Tensor::from_parts(vec![1], TensorData::I8(vec![9].into())),
            DType::I4,
        )
        .unwrap_err();
        assert!(e.contains("9 does not fit int4"), "{e}");
        let e = as_low_bit(
            Tensor::from_parts(vec![1], TensorData::U8(vec![0x10].into())),
            DType::F4E2M1,
        )
        .unwrap_err();
        assert!(e.contains("not a float4e2m1 code"), "{e}");
        // ml_dtypes arrays saved by np.save: descr V1, raw bytes.
        let mut npy = to_npy(&Tensor::from_parts(
            vec![1],
            TensorData::U8(vec![0x38].into()),
        ))
        .unwrap();
        let pos = npy.windows(3).position(|w| w == b"|u1").unwrap();
        npy[pos..pos + 3].copy_from_slice(b"<V1");
        assert_eq!(
            from_npy(&npy).unwrap().data(),
            &TensorData::U8(vec![0x38].into())
        );
    }
}
