//! The process's allocator settings, for binaries (`main.rs`, the benchmarks) to apply once at
//! start-up: the library itself never changes process-wide state.
//!
//! Why: an inference allocates and frees the same large buffers (layer outputs, im2col
//! columns) on every run. glibc's malloc serves blocks above its mmap threshold (128 KiB at
//! first, raised dynamically up to the largest block freed) with fresh `mmap`s, and returns
//! the top of its heap to the system past a 128 KiB trim threshold, so those buffers came
//! back as new zero pages each run: ~190,000–285,000 page faults per YOLOv8n benchmark run
//! of ~200 inferences. Fixed thresholds — blocks up to 32 MiB (glibc's ceiling for the
//! setting on 64-bit) from the heap, freed memory kept — cut that to ~11,000 and made
//! inference 10–20 % faster on YOLOv8n, PP-OCRv4 rec and the bench transformer, with no
//! change elsewhere (docs/performance-history.md, 2026-11-26 06:44; ONNX Runtime keeps its
//! own arena for the same reason).

/// Sets glibc's mmap threshold to 32 MiB and its trim threshold to 2 GiB (both fixed:
/// glibc then stops adjusting them). Does nothing on other platforms and C libraries.
pub fn keep_freed_memory_for_reuse() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes two malloc parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
