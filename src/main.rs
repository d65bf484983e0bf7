//! The `mixprec` binary: all work is in the library; see `mixprec::cli`.

fn main() -> std::process::ExitCode {
    mixprec::cli::main()
}
