//! Polygraphy's TensorRT-only (and ONNX-Runtime-only) options: accepted so that a pasted
//! Polygraphy command runs, with one warning naming those that have no effect on the emulation.
//! Options that would change the network itself (network/config scripts, tensor dtypes) have no
//! counterpart and are refused with the mixprec spelling to use instead.

use anyhow::{bail, Result};
use clap::Args;

macro_rules! trt_only_args {
    (
        flags { $( $f:ident = $fl:literal $(| $fa:literal)* ; )* }
        values { $( $v:ident = $vl:literal $(| $va:literal)* ; )* }
        lists { $( $l:ident = $ll:literal $(| $la:literal)* ; )* }
        refused { $( $r:ident = $rl:literal $(| $ra:literal)* => $why:literal ; )* }
    ) => {
        /// TensorRT builder/runtime options (hidden from --help; see README "Coming from
        /// Polygraphy").
        #[derive(Args, Debug, Clone, Default)]
        pub struct TrtOnlyArgs {
            $( #[arg(long = $fl, hide = true $(, alias = $fa)*)] pub $f: bool, )*
            $( #[arg(long = $vl, hide = true, value_name = "VALUE" $(, alias = $va)*)] pub $v: Option<String>, )*
            $( #[arg(long = $ll, hide = true, num_args = 0.., value_name = "VALUE" $(, alias = $la)*)] pub $l: Option<Vec<String>>, )*
            $( #[arg(long = $rl, hide = true, num_args = 0.., value_name = "VALUE" $(, alias = $ra)*)] pub $r: Option<Vec<String>>, )*
            /// TensorRT's min/opt/max shapes of an optimization profile: opt is used as
            /// --input-shapes, min and max have no effect.
            #[arg(long = "trt-min-shapes", num_args = 1.., value_name = "SHAPE")]
            pub trt_min_shapes: Vec<String>,
            #[arg(long = "trt-opt-shapes", num_args = 1.., value_name = "SHAPE")]
            pub trt_opt_shapes: Vec<String>,
            #[arg(long = "trt-max-shapes", num_args = 1.., value_name = "SHAPE")]
            pub trt_max_shapes: Vec<String>,
        }

        impl TrtOnlyArgs {
            /// The options given that have no effect, by their flag.
            pub fn given(&self) -> Vec<String> {
                let mut v: Vec<String> = Vec::new();
                $( if self.$f { v.push(concat!("--", $fl).into()); } )*
                $( if self.$v.is_some() { v.push(concat!("--", $vl).into()); } )*
                $( if self.$l.is_some() { v.push(concat!("--", $ll).into()); } )*
                if !self.trt_min_shapes.is_empty() { v.push("--trt-min-shapes".into()); }
                if !self.trt_max_shapes.is_empty() { v.push("--trt-max-shapes".into()); }
                v
            }

            /// An error for an option without a counterpart.
            pub fn check_refused(&self) -> Result<()> {
                $( if self.$r.is_some() {
                    bail!(concat!("--", $rl, " has no counterpart in mixprec: ", $why));
                } )*
                Ok(())
            }
        }
    };
}

trt_only_args! {
    flags {
        tf32 = "tf32";
        sparse_weights = "sparse-weights";
        version_compatible = "version-compatible";
        exclude_lean_runtime = "exclude-lean-runtime";
        error_on_timing_cache_miss = "error-on-timing-cache-miss";
        disable_compilation_cache = "disable-compilation-cache";
        trt_safety_restricted = "trt-safety-restricted";
        refittable = "refittable";
        strip_plan = "strip-plan";
        use_dla = "use-dla";
        allow_gpu_fallback = "allow-gpu-fallback";
        weight_streaming = "weight-streaming";
        direct_io = "direct-io";
        use_gpu = "use-gpu";
        plugin_instancenorm = "plugin-instancenorm";
        strongly_typed = "strongly-typed";
        decomposable_attentions = "decomposable-attentions";
        mark_unfused = "mark-unfused-tensors-as-debug-tensors";
        uint8_asym_dla = "enable-uint8-asymmetric-quantization-dla";
        // Polygraphy's runner-timing options: they change how runs are timed, not results.
        use_subprocess = "use-subprocess";
    }
    values {
        timing_cache = "timing-cache";
        load_timing_cache = "load-timing-cache";
        save_timing_cache = "save-timing-cache";
        save_tactics = "save-tactics" | "save-tactic-replay";
        load_tactics = "load-tactics" | "load-tactic-replay";
        builder_optimization_level = "builder-optimization-level";
        hardware_compatibility_level = "hardware-compatibility-level";
        max_aux_streams = "max-aux-streams";
        profiling_verbosity = "profiling-verbosity";
        runtime_platform = "runtime-platform";
        engine_capability = "engine-capability";
        tiling_optimization_level = "tiling-optimization-level";
        optimization_profile = "optimization-profile";
        allocation_strategy = "allocation-strategy";
        weight_streaming_budget = "weight-streaming-budget";
        load_runtime = "load-runtime";
        dla_workspace_allocation_strategy = "dla-workspace-allocation-strategy";
        workspace = "workspace";
        save_engine = "save-engine";
        max_batch_size = "max-batch-size";
    }
    lists {
        tactic_sources = "tactic-sources";
        pool_limit = "pool-limit" | "memory-pool-limit";
        preview_features = "preview-features";
        quantization_flags = "quantization-flags";
        compute_capabilities = "compute-capabilities";
        plugins = "plugins";
        onnx_flags = "onnx-flags";
        tensor_formats = "tensor-formats";
        all_tensor_formats = "all-tensor-formats";
        mark_debug = "mark-debug";
        providers = "providers" | "execution-providers";
    }
    refused {
        trt_npps = "trt-network-postprocess-script" | "trt-npps" =>
            "it edits a TensorRT network through TensorRT's Python API; give the layers' precisions with --layer-precisions NAME:float32 ... (and --precision-constraints obey)";
        trt_network_func = "trt-network-func-name" =>
            "network scripts need TensorRT; give the layers' precisions with --layer-precisions";
        trt_config_script = "trt-config-script" =>
            "it builds a TensorRT builder config; use --fp16/--bf16/--int8/--fp8 and --layer-precisions";
        trt_cpps = "trt-config-postprocess-script" | "trt-cpps" =>
            "it edits a TensorRT builder config; use --fp16/--bf16/--int8/--fp8 and --layer-precisions";
        tensor_dtypes = "tensor-dtypes" | "tensor-datatypes" =>
            "mixprec keeps tensors in the layer's precision; use --layer-precisions";
        all_tensor_dtypes = "all-tensor-dtypes" | "all-tensor-datatypes" =>
            "mixprec keeps tensors in the layer's precision; use --layer-precisions";
        trt_outputs_by_type = "trt-outputs-by-type" =>
            "mark tensors by name or `mark all` with --trt-outputs";
    }
}

impl TrtOnlyArgs {
    /// Refuses options without a counterpart; returns the one warning line naming the options
    /// given that have no effect (None when there are none).
    pub fn check(&self) -> Result<Option<String>> {
        self.check_refused()?;
        let given = self.given();
        Ok((!given.is_empty()).then(|| {
            format!(
                "{} {} TensorRT/ONNX-Runtime option{} with no effect on mixprec's emulation (accepted so Polygraphy commands run unchanged)",
                given.join(", "),
                if given.len() == 1 { "is a" } else { "are" },
                if given.len() == 1 { "" } else { "s" }
            )
        }))
    }
}
