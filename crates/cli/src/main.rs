//! The `mixprec` binary: all work is in the library; see the `mixprec_cli` library.

/// mimalloc, not glibc's malloc. An inference frees and allocates the same large buffers
/// (layer outputs, packed and padded copies) on every run; glibc hands back the free block
/// it has held longest (its unsorted and large bins are first in, first out), which is no
/// longer in any cache, so each layer's first writes to its output missed every level (the
/// bench transformer's 256 KiB attention scores: 100 µs on a product that runs in 42 µs on
/// memory in cache). mimalloc reuses a thread's most recently freed block of a size class
/// first: Intel Xeon, two cores, −6 to −15 % on every model measured, Zen 4 0 to −5 %
/// (Magika +2 %; docs/performance-history.md, "Layer outputs in warm memory"). The
/// benchmarks and the Python module run with it too; the library itself never chooses an
/// allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Like other Unix tools, end quietly when stdout is a closed pipe (`mixprec ... | head`)
    // instead of panicking on the failed write: Rust ignores SIGPIPE by default.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    mixprec_cli::main()
}
