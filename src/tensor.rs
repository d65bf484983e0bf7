//! Dense tensors: a shape and a typed, row-major buffer.
//!
//! Every ONNX numeric element type that the interpreter can meet in a real model or in the
//! conformance data has its own variant, so values are never silently widened or narrowed.
//! Float kernels compute in `f32` (the product's reference precision); `f64` tensors keep
//! their own storage and are computed in `f64` where an op supports it.

use crate::lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, I4, U4};
use half::{bf16, f16};
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

/// Inputs by name. A BTreeMap so iteration order (and so every derived result) is stable.
pub type Feeds = std::collections::BTreeMap<String, Tensor>;

/// Element type of a tensor, named as ONNX / NumPy name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    Str,
    /// The 8- and 4-bit types (src/lowbit.rs): one byte per element in memory, 4-bit types
    /// packed two per byte in ONNX files.
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    U4,
    I4,
    F4E2M1,
}

impl DType {
    /// From `TensorProto.DataType`.
    pub fn from_onnx(code: i32) -> Option<DType> {
        Some(match code {
            1 => DType::F32,
            2 => DType::U8,
            3 => DType::I8,
            4 => DType::U16,
            5 => DType::I16,
            6 => DType::I32,
            7 => DType::I64,
            8 => DType::Str,
            9 => DType::Bool,
            10 => DType::F16,
            11 => DType::F64,
            12 => DType::U32,
            13 => DType::U64,
            16 => DType::BF16,
            17 => DType::F8E4M3FN,
            18 => DType::F8E4M3FNUZ,
            19 => DType::F8E5M2,
            20 => DType::F8E5M2FNUZ,
            21 => DType::U4,
            22 => DType::I4,
            23 => DType::F4E2M1,
            _ => return None,
        })
    }

    /// To `TensorProto.DataType`.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Str => 8,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3FN => 17,
            DType::F8E4M3FNUZ => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2FNUZ => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
        }
    }

    /// NumPy's name (`float32`, `int64`, `bool`, ...), as Polygraphy prints it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::Str => "str",
            // ONNX's names, lower case (as Polygraphy's DataType prints them).
            DType::F8E4M3FN => "float8e4m3fn",
            DType::F8E4M3FNUZ => "float8e4m3fnuz",
            DType::F8E5M2 => "float8e5m2",
            DType::F8E5M2FNUZ => "float8e5m2fnuz",
            DType::U4 => "uint4",
            DType::I4 => "int4",
            DType::F4E2M1 => "float4e2m1",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "float32" | "float" => DType::F32,
            "float64" | "double" => DType::F64,
            "float16" | "half" => DType::F16,
            "bfloat16" => DType::BF16,
            "int8" => DType::I8,
            "uint8" => DType::U8,
            "int16" => DType::I16,
            "uint16" => DType::U16,
            "int32" => DType::I32,
            "uint32" => DType::U32,
            "int64" => DType::I64,
            "uint64" => DType::U64,
            "bool" => DType::Bool,
            "str" | "string" => DType::Str,
            // ONNX's names and ml_dtypes' spellings.
            "float8e4m3fn" | "float8_e4m3fn" => DType::F8E4M3FN,
            "float8e4m3fnuz" | "float8_e4m3fnuz" => DType::F8E4M3FNUZ,
            "float8e5m2" | "float8_e5m2" => DType::F8E5M2,
            "float8e5m2fnuz" | "float8_e5m2fnuz" => DType::F8E5M2FNUZ,
            "uint4" => DType::U4,
            "int4" => DType::I4,
            "float4e2m1" | "float4_e2m1fn" => DType::F4E2M1,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::U8
                | DType::I16
                | DType::U16
                | DType::I32
                | DType::U32
                | DType::I64
                | DType::U64
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// The four float8 types. Like the other low-bit types they are storage and
    /// quantization types: Cast, QuantizeLinear/DequantizeLinear and data movement accept
    /// them, arithmetic kernels do not (`is_float` is false for them).
    pub fn is_fp8(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ
        )
    }

    /// The 8- and 4-bit storage types of [`crate::lowbit`] (float8, int4, uint4, float4).
    pub fn is_low_bit(self) -> bool {
        self.is_fp8() || self.is_4bit()
    }

    /// int4, uint4 and float4e2m1: packed two per byte in ONNX files.
    pub fn is_4bit(self) -> bool {
        matches!(self, DType::U4 | DType::I4 | DType::F4E2M1)
    }

    /// Bytes that `n` elements take in an ONNX `raw_data` field (4-bit types packed two per
    /// byte, rounded up; strings have no fixed size).
    pub fn stored_bytes(self, n: usize) -> usize {
        if self.is_4bit() {
            n.div_ceil(2)
        } else {
            n * self.size()
        }
    }

    /// Size of one element in bytes (strings: 0, they have no fixed size).
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
            // In memory; see `stored_bytes` for files.
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::U4
            | DType::I4
            | DType::F4E2M1 => 1,
            DType::Str => 0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element types whose in-memory form is their little-endian stored form on a little-endian
/// machine, and for which every bit pattern is a valid value: a buffer of them can be read in
/// place from the bytes of a file ([`Buf::from_le_bytes`]). `bool` is not one (only 0 and 1
/// are valid), nor are the packed 4-bit types.
///
/// # Safety
/// Implementors must have no padding, no invalid bit patterns and the layout of their
/// little-endian encoding.
pub unsafe trait Plain: Copy + 'static {}

macro_rules! plain {
    ($($t:ty),*) => { $(unsafe impl Plain for $t {})* };
}
plain!(f32, f64, f16, bf16, i8, u8, i16, u16, i32, u32, i64, u64);
// SAFETY: the float8 types (lowbit.rs) are a transparent u8 and every bit pattern is a
// value, so their stored bytes can be read in place.
plain!(
    crate::lowbit::F8E4M3FN,
    crate::lowbit::F8E4M3FNUZ,
    crate::lowbit::F8E5M2,
    crate::lowbit::F8E5M2FNUZ
);

/// A reference-counted, immutable buffer of elements (the storage half of candle's
/// storage/layout split): it derefs to `&[T]`, `clone` shares it (no element is copied), and
/// the rare mutation copies on write ([`Buf::make_mut`]).
///
/// The elements live either in a vector the buffer owns, or in place in bytes kept alive by a
/// [`bytes::Bytes`]: a memory-mapped model file or external-data file, whose pages the
/// operating system reads only when a kernel touches them.
pub struct Buf<T>(Repr<T>);

enum Repr<T> {
    Owned(Arc<Vec<T>>),
    /// `len` elements read in place; the bytes are aligned for `T` (checked on construction).
    Borrowed(bytes::Bytes, PhantomData<T>),
}

impl<T> Buf<T> {
    /// Wraps a vector (no copy).
    pub fn from_vec(v: Vec<T>) -> Buf<T> {
        Buf(Repr::Owned(Arc::new(v)))
    }

    /// The elements as a slice.
    pub fn as_slice(&self) -> &[T] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Borrowed(b, _) => {
                // SAFETY: `from_le_bytes` admitted only `T: Plain` (every bit pattern valid),
                // a byte count that is a multiple of `size_of::<T>()`, a pointer aligned for
                // `T` and a non-empty buffer; `b` keeps the bytes alive and never changes them.
                unsafe {
                    std::slice::from_raw_parts(
                        b.as_ptr().cast::<T>(),
                        b.len() / std::mem::size_of::<T>(),
                    )
                }
            }
        }
    }

    /// True when the elements are read in place from borrowed bytes (a memory map).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Repr::Borrowed(..))
    }

    /// The bytes the elements are read from in place, if they are borrowed: their
    /// little-endian stored form (borrowing happens on little-endian machines only).
    pub fn borrowed_bytes(&self) -> Option<bytes::Bytes> {
        match &self.0 {
            Repr::Borrowed(b, _) => Some(b.clone()),
            Repr::Owned(_) => None,
        }
    }

    /// True when both buffers are the same memory (clones of one another).
    pub fn ptr_eq(&self, other: &Buf<T>) -> bool {
        std::ptr::eq(self.as_slice(), other.as_slice())
    }
}

impl<T: Plain> Buf<T> {
    /// The elements stored little-endian in `bytes`, read in place when the bytes are aligned
    /// for `T` and the machine is little-endian, copied otherwise. None when the byte count is
    /// not a multiple of the element size.
    pub fn from_le_bytes(bytes: bytes::Bytes) -> Option<Buf<T>> {
        let w = std::mem::size_of::<T>();
        if !bytes.len().is_multiple_of(w) {
            return None;
        }
        let aligned = bytes.as_ptr().cast::<T>().is_aligned();
        if cfg!(target_endian = "little") && aligned && !bytes.is_empty() {
            return Some(Buf(Repr::Borrowed(bytes, PhantomData)));
        }
        let n = bytes.len() / w;
        let mut v: Vec<T> = Vec::with_capacity(n);
        // SAFETY: `T: Plain` accepts any bit pattern; the copy fills exactly `n` elements.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * w);
            v.set_len(n);
        }
        if cfg!(target_endian = "big") {
            for x in v.iter_mut() {
                // SAFETY: reversing the bytes of a Plain value gives another valid value.
                let p = (x as *mut T).cast::<u8>();
                unsafe { std::slice::from_raw_parts_mut(p, w).reverse() };
            }
        }
        Some(Buf::from_vec(v))
    }
}

impl<T: Clone> Buf<T> {
    /// The elements, mutable: shared or borrowed elements are copied first (copy on write).
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if let Repr::Borrowed(..) = self.0 {
            *self = Buf::from_vec(self.as_slice().to_vec());
        }
        match &mut self.0 {
            Repr::Owned(v) => Arc::make_mut(v),
            Repr::Borrowed(..) => unreachable!("replaced above"),
        }
    }

    /// The elements as a vector (no copy when this buffer owns them alone).
    pub fn into_vec(self) -> Vec<T> {
        match self.0 {
            Repr::Owned(v) => Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone()),
            Repr::Borrowed(..) => self.as_slice().to_vec(),
        }
    }
}

impl<T> Clone for Buf<T> {
    fn clone(&self) -> Self {
        Buf(match &self.0 {
            Repr::Owned(v) => Repr::Owned(Arc::clone(v)),
            Repr::Borrowed(b, _) => Repr::Borrowed(b.clone(), PhantomData),
        })
    }
}

impl<T> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> AsRef<[T]> for Buf<T> {
    fn as_ref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> Default for Buf<T> {
    fn default() -> Self {
        Buf::from_vec(Vec::new())
    }
}

impl<T> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Self {
        Buf::from_vec(v)
    }
}

impl<T: Clone> From<&[T]> for Buf<T> {
    fn from(v: &[T]) -> Self {
        Buf::from_vec(v.to_vec())
    }
}

impl<T> FromIterator<T> for Buf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Buf::from_vec(iter.into_iter().collect())
    }
}

impl<'a, T> IntoIterator for &'a Buf<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<T: PartialEq> PartialEq for Buf<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: PartialEq> PartialEq<Vec<T>> for Buf<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: fmt::Debug> fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

/// The typed buffer of a tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Buf<f32>),
    F64(Buf<f64>),
    F16(Buf<f16>),
    BF16(Buf<bf16>),
    I8(Buf<i8>),
    U8(Buf<u8>),
    I16(Buf<i16>),
    U16(Buf<u16>),
    I32(Buf<i32>),
    U32(Buf<u32>),
    I64(Buf<i64>),
    U64(Buf<u64>),
    Bool(Buf<bool>),
    Str(Buf<String>),
    F8E4M3FN(Buf<F8E4M3FN>),
    F8E4M3FNUZ(Buf<F8E4M3FNUZ>),
    F8E5M2(Buf<F8E5M2>),
    F8E5M2FNUZ(Buf<F8E5M2FNUZ>),
    U4(Buf<U4>),
    I4(Buf<I4>),
    F4E2M1(Buf<F4E2M1>),
}

/// Runs `$body` with `$v` bound to the inner `Vec` of any variant and wraps the result in the
/// same variant. `$body` must be generic over the element type (only `Clone` is guaranteed);
/// this is how data-movement ops (Transpose, Gather, Slice, ...) serve every dtype at once.
#[macro_export]
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {{
        use $crate::tensor::TensorData as TD;
        match $data {
            TD::F32($v) => TD::F32($body),
            TD::F64($v) => TD::F64($body),
            TD::F16($v) => TD::F16($body),
            TD::BF16($v) => TD::BF16($body),
            TD::I8($v) => TD::I8($body),
            TD::U8($v) => TD::U8($body),
            TD::I16($v) => TD::I16($body),
            TD::U16($v) => TD::U16($body),
            TD::I32($v) => TD::I32($body),
            TD::U32($v) => TD::U32($body),
            TD::I64($v) => TD::I64($body),
            TD::U64($v) => TD::U64($body),
            TD::Bool($v) => TD::Bool($body),
            TD::Str($v) => TD::Str($body),
            TD::F8E4M3FN($v) => TD::F8E4M3FN($body),
            TD::F8E4M3FNUZ($v) => TD::F8E4M3FNUZ($body),
            TD::F8E5M2($v) => TD::F8E5M2($body),
            TD::F8E5M2FNUZ($v) => TD::F8E5M2FNUZ($body),
            TD::U4($v) => TD::U4($body),
            TD::I4($v) => TD::I4($body),
            TD::F4E2M1($v) => TD::F4E2M1($body),
        }
    }};
}

/// Like [`map_data!`] but for bodies that return something other than a Vec (e.g. a length).
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {{
        use $crate::tensor::TensorData as TD;
        match $data {
            TD::F32($v) => $body,
            TD::F64($v) => $body,
            TD::F16($v) => $body,
            TD::BF16($v) => $body,
            TD::I8($v) => $body,
            TD::U8($v) => $body,
            TD::I16($v) => $body,
            TD::U16($v) => $body,
            TD::I32($v) => $body,
            TD::U32($v) => $body,
            TD::I64($v) => $body,
            TD::U64($v) => $body,
            TD::Bool($v) => $body,
            TD::Str($v) => $body,
            TD::F8E4M3FN($v) => $body,
            TD::F8E4M3FNUZ($v) => $body,
            TD::F8E5M2($v) => $body,
            TD::F8E5M2FNUZ($v) => $body,
            TD::U4($v) => $body,
            TD::I4($v) => $body,
            TD::F4E2M1($v) => $body,
        }
    }};
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F64(_) => DType::F64,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::I16(_) => DType::I16,
            TensorData::U16(_) => DType::U16,
            TensorData::I32(_) => DType::I32,
            TensorData::U32(_) => DType::U32,
            TensorData::I64(_) => DType::I64,
            TensorData::U64(_) => DType::U64,
            TensorData::Bool(_) => DType::Bool,
            TensorData::Str(_) => DType::Str,
            TensorData::F8E4M3FN(_) => DType::F8E4M3FN,
            TensorData::F8E4M3FNUZ(_) => DType::F8E4M3FNUZ,
            TensorData::F8E5M2(_) => DType::F8E5M2,
            TensorData::F8E5M2FNUZ(_) => DType::F8E5M2FNUZ,
            TensorData::U4(_) => DType::U4,
            TensorData::I4(_) => DType::I4,
            TensorData::F4E2M1(_) => DType::F4E2M1,
        }
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An all-zero (false, empty string) buffer of `n` elements.
    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(vec![0.0; n].into()),
            DType::F64 => TensorData::F64(vec![0.0; n].into()),
            DType::F16 => TensorData::F16(vec![f16::ZERO; n].into()),
            DType::BF16 => TensorData::BF16(vec![bf16::ZERO; n].into()),
            DType::I8 => TensorData::I8(vec![0; n].into()),
            DType::U8 => TensorData::U8(vec![0; n].into()),
            DType::I16 => TensorData::I16(vec![0; n].into()),
            DType::U16 => TensorData::U16(vec![0; n].into()),
            DType::I32 => TensorData::I32(vec![0; n].into()),
            DType::U32 => TensorData::U32(vec![0; n].into()),
            DType::I64 => TensorData::I64(vec![0; n].into()),
            DType::U64 => TensorData::U64(vec![0; n].into()),
            DType::Bool => TensorData::Bool(vec![false; n].into()),
            DType::Str => TensorData::Str(vec![String::new(); n].into()),
            DType::F8E4M3FN => TensorData::F8E4M3FN(vec![F8E4M3FN::default(); n].into()),
            DType::F8E4M3FNUZ => TensorData::F8E4M3FNUZ(vec![F8E4M3FNUZ::default(); n].into()),
            DType::F8E5M2 => TensorData::F8E5M2(vec![F8E5M2::default(); n].into()),
            DType::F8E5M2FNUZ => TensorData::F8E5M2FNUZ(vec![F8E5M2FNUZ::default(); n].into()),
            DType::U4 => TensorData::U4(vec![U4::default(); n].into()),
            DType::I4 => TensorData::I4(vec![I4::default(); n].into()),
            DType::F4E2M1 => TensorData::F4E2M1(vec![F4E2M1::default(); n].into()),
        }
    }

    /// Joins buffers of one dtype end to end (None if the dtypes differ or `parts` is empty).
    pub fn concat(parts: &[&TensorData]) -> Option<TensorData> {
        // The parts whole, one after another: one block each.
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        Self::concat_blocks(parts, &lens, 1)
    }

    /// For each of `outer` blocks, each part's `o`-th block of `blocks[i]` values in part
    /// order (Concat on an axis with `outer` indices before it), in one pass: `None` where the
    /// dtypes differ or a part does not hold `outer` blocks.
    pub fn concat_blocks(
        parts: &[&TensorData],
        blocks: &[usize],
        outer: usize,
    ) -> Option<TensorData> {
        let first = parts.first()?;
        if parts.len() != blocks.len()
            || parts
                .iter()
                .zip(blocks)
                .any(|(p, &b)| p.dtype() != first.dtype() || p.len() != outer * b)
        {
            return None;
        }
        macro_rules! join {
            ($($v:ident),*) => {
                match first {
                    $(TensorData::$v(_) => {
                        let views: Vec<_> = parts
                            .iter()
                            .map(|p| match p {
                                TensorData::$v(x) => &x[..],
                                _ => unreachable!("dtypes checked above"),
                            })
                            .collect();
                        let mut out = Vec::with_capacity(outer * blocks.iter().sum::<usize>());
                        for o in 0..outer {
                            for (x, &b) in views.iter().zip(blocks) {
                                out.extend_from_slice(&x[o * b..(o + 1) * b]);
                            }
                        }
                        TensorData::$v(out.into())
                    },)*
                }
            };
        }
        Some(join!(
            F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64, Bool, Str, F8E4M3FN,
            F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, U4, I4, F4E2M1
        ))
    }

    /// Picks elements by index (indices must be in range: kernels check before calling).
    #[allow(clippy::clone_on_copy)] // one generic body serves Copy and String buffers
    pub fn gather(&self, indices: &[usize]) -> TensorData {
        map_data!(self, v => indices.iter().map(|&i| v[i].clone()).collect())
    }

    /// Concatenates runs of consecutive elements, each `(start, len)` (in range: kernels check
    /// before calling); a row copy instead of one index per element.
    #[allow(clippy::clone_on_copy)] // one generic body serves Copy and String buffers
    pub fn gather_runs(&self, runs: &[(usize, usize)]) -> TensorData {
        let total = runs.iter().map(|r| r.1).sum();
        map_data!(self, v => {
            let mut out = Vec::with_capacity(total);
            for &(start, len) in runs {
                // A lone value pushed, not copied as a slice (a memcpy call per value of
                // Pad's reflected borders).
                if len == 1 {
                    out.push(v[start].clone());
                } else {
                    out.extend_from_slice(&v[start..start + len]);
                }
            }
            out.into()
        })
    }

    /// Every element as f64 (bool as 0/1). Strings have no numeric value.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        Some(match self {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::F64(v) => v.to_vec(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::U64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            TensorData::Str(_) => return None,
            TensorData::F8E4M3FN(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::F8E4M3FNUZ(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::F8E5M2(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::F8E5M2FNUZ(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::U4(v) => v.iter().map(|x| x.get() as f64).collect(),
            TensorData::I4(v) => v.iter().map(|x| x.get() as f64).collect(),
            TensorData::F4E2M1(v) => v.iter().map(|x| x.to_f64()).collect(),
        })
    }

    /// Every element as f32 (bool as 0/1; f64 rounded to nearest).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        Some(match self {
            TensorData::F32(v) => v.to_vec(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::F8E4M3FN(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F8E4M3FNUZ(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F8E5M2(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F8E5M2FNUZ(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::F4E2M1(v) => v.iter().map(|x| x.to_f32()).collect(),
            other => other.to_f64_vec()?.into_iter().map(|x| x as f32).collect(),
        })
    }

    /// Every element as i64. Floats truncate toward zero (as C casts and ONNX Cast do).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            TensorData::I64(v) => v.to_vec(),
            TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U64(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::F32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::F64(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::U4(v) => v.iter().map(|x| x.get() as i64).collect(),
            TensorData::I4(v) => v.iter().map(|x| x.get() as i64).collect(),
            TensorData::F8E4M3FN(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::F8E4M3FNUZ(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::F8E5M2(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::F8E5M2FNUZ(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::F4E2M1(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            TensorData::Str(_) => return None,
        })
    }
}

/// An n-dimensional array. A scalar has an empty shape and one element.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: TensorData,
}

/// A tensor whose buffer length does not match its shape.
#[derive(Debug, Clone, thiserror::Error)]
#[error("buffer of {len} elements does not fit shape {shape:?} ({expected} elements)")]
pub struct ShapeMismatch {
    pub shape: Vec<usize>,
    pub len: usize,
    pub expected: usize,
}

impl Tensor {
    /// Builds a tensor, checking that the buffer holds exactly `prod(shape)` elements.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Tensor, ShapeMismatch> {
        let expected: usize = shape.iter().product();
        if data.len() != expected {
            return Err(ShapeMismatch {
                shape,
                len: data.len(),
                expected,
            });
        }
        Ok(Tensor { shape, data })
    }

    /// Builds a tensor whose length the caller has already made right (kernels use this).
    /// A wrong length is a bug in the kernel, so it panics in debug builds only.
    pub fn from_parts(shape: Vec<usize>, data: TensorData) -> Tensor {
        debug_assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "kernel built a tensor of the wrong length for shape {shape:?}"
        );
        Tensor { shape, data }
    }

    pub fn from_f32(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        Tensor::from_parts(shape, TensorData::F32(v.into()))
    }

    pub fn from_f64(shape: Vec<usize>, v: Vec<f64>) -> Tensor {
        Tensor::from_parts(shape, TensorData::F64(v.into()))
    }

    pub fn from_i64(shape: Vec<usize>, v: Vec<i64>) -> Tensor {
        Tensor::from_parts(shape, TensorData::I64(v.into()))
    }

    pub fn from_bool(shape: Vec<usize>, v: Vec<bool>) -> Tensor {
        Tensor::from_parts(shape, TensorData::Bool(v.into()))
    }

    pub fn scalar_f32(x: f32) -> Tensor {
        Tensor::from_f32(vec![], vec![x])
    }

    pub fn scalar_i64(x: i64) -> Tensor {
        Tensor::from_i64(vec![], vec![x])
    }

    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_parts(shape, TensorData::zeros(dtype, n))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }

    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub fn into_parts(self) -> (Vec<usize>, TensorData) {
        (self.shape, self.data)
    }

    /// Same buffer, new shape (caller guarantees the element count is unchanged).
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Tensor, ShapeMismatch> {
        Tensor::new(shape, self.data)
    }

    /// The f32 buffer, if this is an f32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32_mut(&mut self) -> Option<&mut Vec<f32>> {
        match &mut self.data {
            TensorData::F32(v) => Some(v.make_mut()),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<&[bool]> {
        match &self.data {
            TensorData::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// Elements widened/narrowed to f32 (None for strings).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.data.to_f32_vec()
    }

    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        self.data.to_f64_vec()
    }

    /// Elements as i64: what shape, axes and index inputs are read as, whatever their int type.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.data.to_i64_vec()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        strides_of(&self.shape)
    }
}

/// Row-major strides (in elements) of a shape.
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Formats a shape as `(1, 3, 224, 224)`, the way NumPy and Polygraphy print it.
pub fn fmt_shape(shape: &[usize]) -> String {
    match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The float8 tensor data of one code byte per element (`dtype` one of the four float8 types;
/// None for any other type).
pub fn fp8_from_bits(dtype: DType, bytes: &[u8]) -> Option<TensorData> {
    Some(match dtype {
        DType::F8E4M3FN => {
            TensorData::F8E4M3FN(bytes.iter().map(|&b| F8E4M3FN::from_bits(b)).collect())
        }
        DType::F8E4M3FNUZ => {
            TensorData::F8E4M3FNUZ(bytes.iter().map(|&b| F8E4M3FNUZ::from_bits(b)).collect())
        }
        DType::F8E5M2 => TensorData::F8E5M2(bytes.iter().map(|&b| F8E5M2::from_bits(b)).collect()),
        DType::F8E5M2FNUZ => {
            TensorData::F8E5M2FNUZ(bytes.iter().map(|&b| F8E5M2FNUZ::from_bits(b)).collect())
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_length() {
        assert!(Tensor::new(vec![2, 3], TensorData::F32(vec![0.0; 6].into())).is_ok());
        let err = Tensor::new(vec![2, 3], TensorData::F32(vec![0.0; 5].into())).unwrap_err();
        assert_eq!(err.expected, 6);
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(strides_of(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(strides_of(&[]), Vec::<usize>::new());
    }

    #[test]
    fn dtype_codes_round_trip() {
        for code in [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23,
        ] {
            let d = DType::from_onnx(code).unwrap();
            assert_eq!(d.onnx_code(), code);
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert!(DType::from_onnx(14).is_none());
        assert!(DType::from_onnx(24).is_none());
        assert_eq!(DType::I4.stored_bytes(5), 3);
        assert_eq!(DType::F8E5M2.stored_bytes(5), 5);
    }

    #[test]
    fn map_data_keeps_variant() {
        let d = TensorData::I64(vec![1, 2, 3].into());
        let r = map_data!(&d, v => v.iter().rev().cloned().collect());
        assert_eq!(r, TensorData::I64(vec![3, 2, 1].into()));
    }

    #[test]
    fn concat_and_gather() {
        let a = TensorData::I64(vec![1, 2].into());
        let b = TensorData::I64(vec![3].into());
        let c = TensorData::concat(&[&a, &b]).unwrap();
        assert_eq!(c, TensorData::I64(vec![1, 2, 3].into()));
        assert_eq!(c.gather(&[2, 0]), TensorData::I64(vec![3, 1].into()));
        assert!(TensorData::concat(&[&a, &TensorData::F32(vec![].into())]).is_none());
    }

    #[test]
    fn concat_blocks_interleaves_each_parts_block_per_outer_index() {
        // Concat on axis 1 of [2, 3] and [2, 1]: rows of 3 then 1, per outer index.
        let a = TensorData::F32(vec![1., 2., 3., 4., 5., 6.].into());
        let b = TensorData::F32(vec![7., 8.].into());
        let c = TensorData::concat_blocks(&[&a, &b], &[3, 1], 2).unwrap();
        assert_eq!(
            c,
            TensorData::F32(vec![1., 2., 3., 7., 4., 5., 6., 8.].into())
        );
        // One outer index: the parts whole, as `concat`.
        let whole = TensorData::concat_blocks(&[&a, &b], &[6, 2], 1).unwrap();
        assert_eq!(whole, TensorData::concat(&[&a, &b]).unwrap());
        // A part without `outer` blocks of its size, or another dtype: no answer.
        assert!(TensorData::concat_blocks(&[&a, &b], &[3, 2], 2).is_none());
        let i = TensorData::I64(vec![1, 2].into());
        assert!(TensorData::concat_blocks(&[&a, &i], &[3, 1], 2).is_none());
    }

    #[test]
    fn clones_share_buffers_and_mutation_copies() {
        let t = Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let mut c = t.clone();
        assert_eq!(
            t.as_f32().unwrap().as_ptr(),
            c.as_f32().unwrap().as_ptr(),
            "a clone copies no element"
        );
        c.as_f32_mut().unwrap()[0] = 9.0;
        assert_eq!(t.as_f32().unwrap(), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.as_f32().unwrap(), [9.0, 2.0, 3.0, 4.0]);
        // A buffer held once is mutated in place.
        let p = c.as_f32().unwrap().as_ptr();
        c.as_f32_mut().unwrap()[1] = 8.0;
        assert_eq!(c.as_f32().unwrap().as_ptr(), p);
        let b = Buf::from_vec(vec![1u8, 2]);
        assert_eq!(b.clone().into_vec(), vec![1, 2]);
    }

    #[test]
    fn little_endian_bytes_are_read_in_place_when_aligned() {
        let vals = [1.5f32, -2.0, 3.25];
        let mut bytes: Vec<u8> = vec![0];
        bytes.extend(vals.iter().flat_map(|x| x.to_le_bytes()));
        let all = bytes::Bytes::from(bytes);
        // The allocation is aligned, so the slice from byte 1 is not; a fresh copy of it is.
        let unaligned = all.slice(1..);
        let b = Buf::<f32>::from_le_bytes(unaligned.clone()).unwrap();
        assert_eq!(&*b, &vals);
        let aligned = bytes::Bytes::from(unaligned.to_vec());
        assert_eq!(aligned.as_ptr() as usize % 4, 0);
        let a = Buf::<f32>::from_le_bytes(aligned.clone()).unwrap();
        assert_eq!(&*a, &vals);
        if cfg!(target_endian = "little") {
            assert!(a.is_borrowed());
            assert_eq!(a.as_ptr().cast::<u8>(), aligned.as_ptr());
            assert!(!b.is_borrowed(), "unaligned bytes are copied");
            // Copy on write leaves the borrowed bytes alone.
            let mut m = a.clone();
            m.make_mut()[0] = 0.0;
            assert_eq!(&*a, &vals);
            assert!(!m.is_borrowed());
        }
        assert!(Buf::<f32>::from_le_bytes(all.slice(0..3)).is_none());
        assert!(Buf::<f32>::from_le_bytes(bytes::Bytes::new())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn shapes_print_like_numpy() {
        assert_eq!(fmt_shape(&[1, 3]), "(1, 3)");
        assert_eq!(fmt_shape(&[5]), "(5,)");
        assert_eq!(fmt_shape(&[]), "()");
    }
}
