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
use crate::tensor::Feeds;
use std::io::{Read, Write};
use std::path::Path;

/// What a data file holds, judged by its first bytes, never by its name: Polygraphy 0.53
/// writes JSON whatever a `--save-results`/`--save-outputs` path is called (`golden.pkl`
/// included), so a name says nothing about the content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// Text whose first non-blank character is `{` or `[` (Polygraphy's JSON files).
    Json,
    /// A zip archive (`PK\x03\x04`, or `PK\x05\x06` when empty): NumPy's `.npz`.
    Npz,
    /// NumPy's `.npy` magic (`\x93NUMPY`).
    Npy,
    /// A Python pickle of protocol 2 to 5 (`\x80` then the protocol byte), as older
    /// Polygraphy versions wrote.
    Pickle,
    /// Anything else (read as JSON, whose parser then says what is wrong).
    Unknown,
}

impl FileKind {
    /// The kind of a file starting with `head` (its first bytes; [`FileKind::of`] reads 64).
    pub fn sniff(head: &[u8]) -> FileKind {
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            return FileKind::Npz;
        }
        if head.starts_with(b"\x93NUMPY") {
            return FileKind::Npy;
        }
        if let [0x80, 2..=5, ..] = head {
            return FileKind::Pickle;
        }
        let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
        match text.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{' | b'[') => FileKind::Json,
            _ => FileKind::Unknown,
        }
    }

    /// The kind of the file at `path` (its first bytes read); an unreadable file is an error
    /// naming it.
    pub fn of(path: &Path) -> Result<FileKind> {
        let mut head = Vec::with_capacity(64);
        std::fs::File::open(path)
            .and_then(|f| f.take(64).read_to_end(&mut head))
            .map_err(|e| Error::io(path, e))?;
        Ok(FileKind::sniff(&head))
    }
}

/// The error for a Python pickle where a data file was expected: it names the file and says
/// how to re-save it as JSON.
pub fn pickle_error(path: &Path) -> Error {
    Error::data(
        path,
        "a Python pickle, which mixprec does not read (unpickling runs arbitrary code); re-save it as JSON: \
         Polygraphy 0.53 writes JSON whatever the name (`polygraphy run ... --save-outputs golden.json`), \
         and an older Polygraphy's pickle converts with \
         `python3 -c \"import pickle, sys; from polygraphy.json import save_json; save_json(pickle.load(open(sys.argv[1], 'rb')), sys.argv[2])\" FILE.pkl FILE.json`",
    )
}

/// Input sets from one `--load-inputs` path, by content: a Polygraphy inputs JSON (a list of
/// feed dicts) or a directory of per-iteration JSON files, or one `.npz` archive (one input
/// set). A `.npy` (one unnamed array) and a pickle are errors saying what to use instead.
pub fn load_input_sets(path: &Path) -> Result<Vec<Feeds>> {
    if path.is_dir() {
        return polygraphy::load_inputs(path);
    }
    match FileKind::of(path)? {
        FileKind::Npz => Ok(vec![npy::read_npz(path)?.into_iter().collect()]),
        FileKind::Npy => Err(Error::data(
            path,
            "a single NumPy array (.npy) has no input name: save the inputs as .npz (`np.savez(path, input_name=array)`) or Polygraphy JSON (`--save-inputs inputs.json`)",
        )),
        FileKind::Pickle => Err(pickle_error(path)),
        FileKind::Json | FileKind::Unknown => polygraphy::load_inputs(path),
    }
}

/// Checks, before a long job, that a file can later be written at `path` (`flag` names the
/// option): its folder exists and `path` is not a folder. Not a promise (the disk may fill),
/// but a mistyped folder fails now instead of after a search.
pub fn check_destination(path: &Path, flag: &str) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "{flag} {}: the folder {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    if path.is_dir() {
        return Err(Error::Invalid(format!(
            "{flag} {}: is a folder, expected a file path",
            path.display()
        )));
    }
    Ok(())
}

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
    use crate::tensor::Tensor;

    #[test]
    fn a_destination_in_a_missing_folder_or_a_folder_is_refused_up_front() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(check_destination(&tmp.path().join("a.onnx"), "-o").is_ok());
        assert!(check_destination(Path::new("a.onnx"), "-o").is_ok());
        let e = check_destination(&tmp.path().join("missing/a.onnx"), "-o").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = check_destination(tmp.path(), "--report").unwrap_err();
        assert!(e.to_string().starts_with("--report") && e.to_string().contains("is a folder"));
    }

    #[test]
    fn kinds_come_from_content_not_names() {
        assert_eq!(FileKind::sniff(b"  \n{\"lst\": []}"), FileKind::Json);
        assert_eq!(FileKind::sniff(b"\xef\xbb\xbf[{}]"), FileKind::Json);
        assert_eq!(FileKind::sniff(b"PK\x03\x04rest"), FileKind::Npz);
        assert_eq!(FileKind::sniff(b"\x93NUMPY\x01\x00"), FileKind::Npy);
        assert_eq!(FileKind::sniff(b"\x80\x04\x95\x0b"), FileKind::Pickle);
        assert_eq!(FileKind::sniff(b"\x80\x02}q\x00"), FileKind::Pickle);
        assert_eq!(FileKind::sniff(b"\x80\x09"), FileKind::Unknown);
        assert_eq!(FileKind::sniff(b""), FileKind::Unknown);
        assert_eq!(FileKind::sniff(b"hello"), FileKind::Unknown);
    }

    #[test]
    fn inputs_load_by_content_and_pickles_say_how_to_resave() {
        let dir = tempfile::tempdir().unwrap();
        let feeds: Feeds = [("x".to_string(), Tensor::from_f32(vec![2], vec![1.0, 2.0]))]
            .into_iter()
            .collect();
        // JSON named .pkl, and an .npz named .json: both read by what they hold.
        let json_pkl = dir.path().join("inputs.pkl");
        polygraphy::save_inputs(
            &dir.path().join("inputs.json"),
            std::slice::from_ref(&feeds),
        )
        .unwrap();
        std::fs::rename(dir.path().join("inputs.json"), &json_pkl).unwrap();
        let got = load_input_sets(&json_pkl).unwrap();
        assert_eq!(got[0]["x"].to_f32_vec().unwrap(), vec![1.0, 2.0]);
        let npz_json = dir.path().join("arrays.json");
        npy::write_npz(&npz_json, &[("x".into(), feeds["x"].clone())]).unwrap();
        let got = load_input_sets(&npz_json).unwrap();
        assert_eq!(got[0]["x"].to_f32_vec().unwrap(), vec![1.0, 2.0]);
        // A real pickle (protocol 4 of {'a': 1}) is refused with the way out.
        let pkl = dir.path().join("golden.pkl");
        std::fs::write(
            &pkl,
            b"\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.",
        )
        .unwrap();
        let e = load_input_sets(&pkl).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: a Python pickle", pkl.display())),
            "{e}"
        );
        assert!(e.contains("save_json") && !e.contains('\n'), "{e}");
        let e = polygraphy::load_run_results(&pkl).unwrap_err().to_string();
        assert!(e.contains("a Python pickle"), "{e}");
        // A bare .npy has no input name.
        let npy_path = dir.path().join("x.npy");
        std::fs::write(&npy_path, npy::to_npy(&feeds["x"]).unwrap()).unwrap();
        let e = load_input_sets(&npy_path).unwrap_err().to_string();
        assert!(e.contains("no input name"), "{e}");
    }

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
