//! The `mixprec` binary: all work is in the library; see the `mixprec_cli` library.

fn main() -> std::process::ExitCode {
    // Like other Unix tools, end quietly when stdout is a closed pipe (`mixprec ... | head`)
    // instead of panicking on the failed write: Rust ignores SIGPIPE by default.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    mixprec::alloc::keep_freed_memory_for_reuse();
    mixprec_cli::main()
}
