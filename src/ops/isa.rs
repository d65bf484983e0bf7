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
        let signature = __cpuid(1).eax;
        let base = (signature >> 8) & 0xf;
        let family = base
            + if base == 0xf {
                (signature >> 20) & 0xff
            } else {
                0
            };
        let model = ((signature >> 4) & 0xf)
            | if base == 0x6 || base == 0xf {
                ((signature >> 16) & 0xf) << 4
            } else {
                0
            };
        (!name.is_empty()).then(|| format!("{name} (family {family}, model {model})"))
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
