//! The instruction sets the kernels run with on this CPU, as each kernel family chooses them at
//! run time: what a benchmark prints beside its times (bench/run.sh, bench/corpus.sh,
//! bench/kit.py), since the same code runs different kernels on different CPUs.

/// The CPU and the instruction sets its kernels run with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelIsa {
    /// The CPU's name as it gives it (CPUID's brand string), or "unknown".
    pub cpu: String,
    /// Float products and convolutions ([`super::sgemm`]'s tiles).
    pub float: &'static str,
    /// Integer products (MatMulInteger, ConvInteger and the quantized operators'
    /// [`super::int_gemm`]).
    pub integer: &'static str,
    /// Rounding to float16 and bfloat16 (the emulation's, [`crate::numeric`]).
    pub rounding: &'static str,
}

/// The instruction sets the kernels run with on this CPU.
pub fn kernel_isa() -> KernelIsa {
    KernelIsa {
        cpu: cpu_name().unwrap_or_else(|| "unknown".into()),
        float: super::sgemm::instruction_set(),
        integer: super::int_gemm::instruction_set(),
        rounding: crate::numeric::rounding_instruction_set(),
    }
}

impl std::fmt::Display for KernelIsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; kernels: float {}, integer {}, float16/bfloat16 rounding {}",
            self.cpu, self.float, self.integer, self.rounding
        )
    }
}

/// CPUID's brand string (leaves 0x8000_0002–4), trimmed, with the family and model numbers
/// (a virtual machine's brand string may say no more than "AMD EPYC": Zen 4 is family 25,
/// Zen 5 family 26).
fn cpu_name() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 says which extended leaves exist.
        if __cpuid(0x8000_0000).eax < 0x8000_0004 {
            return None;
        }
        let bytes: Vec<u8> = (0x8000_0002u32..=0x8000_0004)
            .map(__cpuid)
            .flat_map(|r| [r.eax, r.ebx, r.ecx, r.edx])
            .flat_map(|r| r.to_le_bytes())
            .collect();
        let name = String::from_utf8_lossy(&bytes);
        let name = name.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        let Signature { family, model, .. } = signature()?;
        (!name.is_empty()).then(|| format!("{name} (family {family}, model {model})"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// A CPU's vendor string (CPUID leaf 0) and family and model numbers (leaf 1, with the
/// extended fields where the base family calls for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub vendor: [u8; 12],
    pub family: u32,
    pub model: u32,
}

/// This CPU's [`Signature`], read once.
pub(crate) fn signature() -> Option<Signature> {
    #[cfg(target_arch = "x86_64")]
    {
        static SIGNATURE: std::sync::OnceLock<Signature> = std::sync::OnceLock::new();
        Some(*SIGNATURE.get_or_init(|| {
            use std::arch::x86_64::__cpuid;
            let leaf0 = __cpuid(0);
            let mut vendor = [0u8; 12];
            for (i, r) in [leaf0.ebx, leaf0.edx, leaf0.ecx].iter().enumerate() {
                vendor[4 * i..4 * i + 4].copy_from_slice(&r.to_le_bytes());
            }
            let eax = __cpuid(1).eax;
            let base = (eax >> 8) & 0xf;
            let family = base + if base == 0xf { (eax >> 20) & 0xff } else { 0 };
            let model = ((eax >> 4) & 0xf)
                | if base == 0x6 || base == 0xf {
                    ((eax >> 16) & 0xf) << 4
                } else {
                    0
                };
            Signature {
                vendor,
                family,
                model,
            }
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family's answer is the one its CPU's features select.
    #[test]
    fn the_report_names_the_kernels_this_cpu_selects() {
        let isa = kernel_isa();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let float_wanted = if avx2 && has!("avx512f") {
                "avx512"
            } else if avx2 {
                "avx2+fma"
            } else {
                "scalar"
            };
            assert!(isa.float.starts_with(float_wanted), "{isa}");
            let integer_wanted = if has!("avx512vnni") && has!("avx512f") {
                "avx512-vnni"
            } else if has!("avxvnni") {
                "avx-vnni"
            } else if has!("avx2") {
                "avx2"
            } else {
                "portable"
            };
            assert_eq!(isa.integer, integer_wanted, "{isa}");
            let rounding_wanted = if has!("avx512f") {
                "avx512"
            } else if has!("avx") && has!("f16c") {
                "f16c"
            } else {
                "scalar"
            };
            assert!(isa.rounding.starts_with(rounding_wanted), "{isa}");
            assert!(!isa.cpu.is_empty() && !isa.cpu.contains('\0'), "{isa}");
        }
        let line = isa.to_string();
        assert!(
            line.contains("kernels: float ") && line.contains(isa.float),
            "{line}"
        );
    }
}
