//! Input and output data: NumPy `.npy`/`.npz`, Polygraphy's JSON files (input feed lists and
//! `RunResults`), the `--val-range` input generator that reproduces Polygraphy's, and
//! Polygraphy's data-loader scripts run in a child Python (`script.rs`).

pub mod loader;
pub mod npy;
pub mod polygraphy;
pub mod script;

/// `.npz` reading and writing (re-exported under the name the CLI uses).
pub mod npz {
    pub use super::npy::{read_npz, write_npz};
}

use crate::error::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// failure never leaves a half-written file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{}: not a file path", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_leaves_nothing_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomic(&p, b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        // A directory that does not exist: an error naming the file, and no temp file left.
        let bad = dir.path().join("nope/out.json");
        let e = write_atomic(&bad, b"{}").unwrap_err().to_string();
        assert!(e.contains("out.json"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
