//! Polygraphy's `--data-loader-script file.py[:func]`: the user's Python function (default
//! `load_data`) returns an iterable of feed dicts `{input name: numpy.ndarray}`.
//!
//! The script runs in a child Python process (`python` given by the caller) driven by a small
//! program passed with `-c`; the arrays stream back over the child's stdout, one feed dict at a
//! time, and nothing is written to disk. The script's own prints go to the child's stderr,
//! which is collected and returned with the feeds (or with the error, holding the traceback).
//! The child runs in its own process group ([`crate::process`]): when the feeds are read (or
//! reading stops early, or fails) the whole group is ended — worker processes the script
//! started included —, a Ctrl-C or SIGTERM ends a script that hangs, and its stderr is kept
//! up to [`OUTPUT_LIMIT`] bytes (the last ones).
//!
//! Wire format (little endian), after the child redirected its `sys.stdout` to stderr:
//! `F u32:count (u32:name_len name u64:npy_len npy_bytes){count}` per feed dict, `E` at the end.
//! A failure in the script exits the child with status 2 after printing the traceback; a missing
//! function, status 3.

use super::npy::from_npy;
use crate::error::{Error, Result};
use crate::graph::check_against;
use crate::graph::ValueInfo;
use crate::process::{CaptureThread, Contained, StopReader, KILL_GRACE, OUTPUT_LIMIT, STOPPED};
use crate::tensor::Feeds;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

/// The default function name, as in Polygraphy.
pub const DEFAULT_FUNC: &str = "load_data";

const DRIVER: &str = r#"
import io, os, struct, sys, traceback, runpy
out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
sys.stdout = sys.stderr
script, func = sys.argv[1], sys.argv[2]
try:
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = [script]
    mod = runpy.run_path(script, run_name="__mixprec_data_loader__")
except BaseException:
    traceback.print_exc()
    sys.exit(2)
if func not in mod or not callable(mod[func]):
    names = sorted(k for k, v in mod.items() if callable(v) and not k.startswith("_"))
    sys.stderr.write("MIXPREC: no function '%s' (callables defined: %s)\n" % (func, ", ".join(names) or "none"))
    sys.exit(3)
index = 0
try:
    for feed in mod[func]():
        if not hasattr(feed, "items"):
            sys.stderr.write("MIXPREC: iteration %d: expected a dict {input name: numpy array}, got %s\n" % (index, type(feed).__name__))
            sys.exit(3)
        items = list(feed.items())
        out.write(b"F" + struct.pack("<I", len(items)))
        for name, arr in items:
            if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
                arr = arr.detach().cpu().numpy() if hasattr(arr, "detach") else arr.numpy()
            arr = np.asarray(arr)
            if not arr.flags["C_CONTIGUOUS"]:  # ascontiguousarray would make a scalar 1-D
                arr = np.ascontiguousarray(arr)
            if arr.dtype == object:
                sys.stderr.write("MIXPREC: iteration %d, input '%s': an array of Python objects, not numbers\n" % (index, name))
                sys.exit(3)
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            data = buf.getvalue()
            key = str(name).encode("utf-8")
            out.write(struct.pack("<I", len(key)) + key + struct.pack("<Q", len(data)) + data)
        out.flush()
        index += 1
    out.write(b"E")
    out.flush()
except SystemExit:
    raise
except BrokenPipeError:
    os._exit(0)
except BaseException:
    sys.stderr.write("MIXPREC: iteration %d\n" % index)
    traceback.print_exc()
    sys.exit(2)
"#;

/// `file.py[:func]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DataLoaderScript {
    pub path: PathBuf,
    pub func: String,
}

impl DataLoaderScript {
    /// Parses `file.py` or `file.py:func` (the suffix counts as a function name only when it
    /// is a Python identifier, so `C:\data.py` stays a path).
    pub fn parse(spec: &str) -> DataLoaderScript {
        if let Some((path, func)) = spec.rsplit_once(':') {
            let ident = !func.is_empty()
                && !func.starts_with(|c: char| c.is_ascii_digit())
                && func.chars().all(|c| c.is_alphanumeric() || c == '_');
            if ident && !path.is_empty() {
                return DataLoaderScript {
                    path: PathBuf::from(path),
                    func: func.to_string(),
                };
            }
        }
        DataLoaderScript {
            path: PathBuf::from(spec),
            func: DEFAULT_FUNC.to_string(),
        }
    }

    fn label(&self) -> String {
        format!("{}:{}", self.path.display(), self.func)
    }

    /// Starts the script's function in a child `python` process.
    pub fn start(&self, python: &Path) -> Result<ScriptFeeds> {
        if !self.path.is_file() {
            return Err(Error::data(
                &self.path,
                "--data-loader-script: no such file",
            ));
        }
        let mut command = Command::new(python);
        command
            .arg("-c")
            .arg(DRIVER)
            .arg(&self.path)
            .arg(&self.func)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = Contained::spawn(&mut command).map_err(|e| {
            Error::Invalid(format!(
                "{}: cannot start Python ('{}': {e}); set MIXPREC_PYTHON to a Python with NumPy",
                self.label(),
                python.display()
            ))
        })?;
        let stdout = child.take_stdout().expect("piped stdout");
        let stderr = child.take_stderr().expect("piped stderr");
        let log = CaptureThread::start(stderr, OUTPUT_LIMIT);
        Ok(ScriptFeeds {
            script: self.clone(),
            child: Some(child),
            stdout: BufReader::with_capacity(1 << 16, StopReader::new(stdout)),
            log: Some(log),
            index: 0,
            done: false,
            log_text: String::new(),
            status: None,
        })
    }

    /// Every feed dict the script yields (at most `limit`), each checked against the model's
    /// inputs; with the script's own output (its prints). An empty iterable is an error.
    pub fn load(
        &self,
        python: &Path,
        inputs: &[ValueInfo],
        limit: Option<usize>,
    ) -> Result<(Vec<Feeds>, String)> {
        let mut it = self.start(python)?;
        let mut feeds = Vec::new();
        while limit.is_none_or(|n| feeds.len() < n) {
            match it.next() {
                Some(f) => {
                    let f = f?;
                    validate_feed(inputs, &f).map_err(|e| {
                        Error::Invalid(format!("{}: iteration {}: {e}", self.label(), feeds.len()))
                    })?;
                    feeds.push(f);
                }
                None => break,
            }
        }
        let log = it.finish();
        if feeds.is_empty() {
            return Err(Error::Invalid(format!(
                "{}: the data loader yielded no feed dicts",
                self.label()
            )));
        }
        Ok((feeds, log))
    }
}

/// The feed dicts of a running script, in order; dropping it ends the child's group.
pub struct ScriptFeeds {
    script: DataLoaderScript,
    child: Option<Contained>,
    stdout: BufReader<StopReader<ChildStdout>>,
    log: Option<CaptureThread>,
    index: usize,
    done: bool,
    log_text: String,
    status: Option<ExitStatus>,
}

impl ScriptFeeds {
    /// Stops the child (if it still runs) and returns what it printed.
    pub fn finish(mut self) -> String {
        self.stop();
        std::mem::take(&mut self.log_text)
    }

    /// Ends the child's group — after waiting for it to end by itself when `wait` is given
    /// (the script finished, or failed and is printing its traceback) — and collects its
    /// output.
    fn stop_after(&mut self, wait: Duration) {
        if let Some(mut c) = self.child.take() {
            self.status = c.finish(wait, KILL_GRACE);
        }
        if let Some(h) = self.log.take() {
            self.log_text = h.finish().text("the data loader's output");
        }
    }

    fn stop(&mut self) {
        // All feeds read: the script ends by itself; stopped early: at once.
        let wait = if self.done {
            KILL_GRACE
        } else {
            Duration::ZERO
        };
        self.stop_after(wait);
    }

    /// The error for a child that stopped without the end marker: its traceback or message.
    fn failure(&mut self, what: &str) -> Error {
        let label = self.script.label();
        if what.contains(STOPPED) || crate::process::stop_requested() {
            self.done = true;
            self.stop_after(Duration::ZERO);
            return Error::Invalid(format!(
                "{label}: the data loader was stopped (Ctrl-C or SIGTERM) after {} feed dict(s)",
                self.index
            ));
        }
        // The stream ended or broke: the script is exiting (a traceback on its way).
        self.done = true;
        self.stop_after(KILL_GRACE);
        let status = self.status;
        let text = self.log_text.trim_end().to_string();
        let own: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("MIXPREC: "))
            .collect();
        let code = status.and_then(|s| s.code());
        if code == Some(3) && !own.is_empty() {
            return Error::Invalid(format!("{label}: {}", own.join("; ")));
        }
        let where_ = own
            .first()
            .map(|s| format!(" ({s})"))
            .unwrap_or_else(|| " (while loading the script)".into());
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with("MIXPREC: "))
            .collect::<Vec<_>>()
            .join("\n");
        if code == Some(2) {
            Error::Invalid(format!(
                "{label}: the data loader raised an exception{where_}:\n{body}"
            ))
        } else {
            let how = match status {
                Some(s) => crate::process::Finished::failure(s)
                    .unwrap_or_else(|| "exited with status 0".into()),
                None => "did not end".into(),
            };
            Error::Invalid(format!(
                "{label}: {what} (the data loader {how}){}",
                if body.is_empty() {
                    String::new()
                } else {
                    format!(":\n{body}")
                }
            ))
        }
    }

    fn read_feed(&mut self) -> std::result::Result<Option<Feeds>, String> {
        let mut tag = [0u8; 1];
        if let Err(e) = self.stdout.read_exact(&mut tag) {
            return Err(if e.to_string() == STOPPED {
                STOPPED.into()
            } else {
                "the data loader stopped unexpectedly".into()
            });
        }
        match tag[0] {
            b'E' => return Ok(None),
            b'F' => {}
            t => return Err(format!("unexpected byte {t:#x} in the data stream")),
        }
        let io = |e: std::io::Error| format!("the data stream broke off: {e}");
        let mut n4 = [0u8; 4];
        self.stdout.read_exact(&mut n4).map_err(io)?;
        let count = u32::from_le_bytes(n4);
        let mut feeds = Feeds::new();
        for _ in 0..count {
            self.stdout.read_exact(&mut n4).map_err(io)?;
            let mut name = vec![0u8; u32::from_le_bytes(n4) as usize];
            self.stdout.read_exact(&mut name).map_err(io)?;
            let name = String::from_utf8_lossy(&name).into_owned();
            let mut n8 = [0u8; 8];
            self.stdout.read_exact(&mut n8).map_err(io)?;
            let len = u64::from_le_bytes(n8);
            let mut data = Vec::new();
            (&mut self.stdout)
                .take(len)
                .read_to_end(&mut data)
                .map_err(io)?;
            if data.len() as u64 != len {
                return Err("the data stream broke off".into());
            }
            let t = from_npy(&data)
                .map_err(|e| format!("iteration {}, input '{name}': {e}", self.index))?;
            feeds.insert(name, t);
        }
        Ok(Some(feeds))
    }
}

impl Iterator for ScriptFeeds {
    type Item = Result<Feeds>;

    fn next(&mut self) -> Option<Result<Feeds>> {
        if self.done {
            return None;
        }
        match self.read_feed() {
            Ok(Some(f)) => {
                self.index += 1;
                Some(Ok(f))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(what) => Some(Err(self.failure(&what))),
        }
    }
}

impl Drop for ScriptFeeds {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One feed dict against the model's inputs: no unknown names, every input present, dtype,
/// rank and fixed dimensions as declared.
pub fn validate_feed(inputs: &[ValueInfo], feed: &Feeds) -> Result<()> {
    for name in feed.keys() {
        if !inputs.iter().any(|v| &v.name == name) {
            let known: Vec<&str> = inputs.iter().map(|v| v.name.as_str()).collect();
            return Err(Error::input(
                name,
                format!(
                    "the model has no such input (its inputs: {})",
                    known.join(", ")
                ),
            ));
        }
    }
    for vi in inputs {
        let t = feed
            .get(&vi.name)
            .ok_or_else(|| Error::input(&vi.name, "no data was given for this model input"))?;
        check_against(vi, t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_script_and_function() {
        let s = DataLoaderScript::parse("data.py");
        assert_eq!(s.path, PathBuf::from("data.py"));
        assert_eq!(s.func, "load_data");
        let s = DataLoaderScript::parse("dir/data.py:calib_data");
        assert_eq!(s.path, PathBuf::from("dir/data.py"));
        assert_eq!(s.func, "calib_data");
        let s = DataLoaderScript::parse("C:\\data.py");
        assert_eq!(s.func, "load_data");
        assert_eq!(s.path, PathBuf::from("C:\\data.py"));
    }

    #[test]
    fn missing_script_is_an_error_naming_it() {
        let e = DataLoaderScript::parse("/nonexistent/dl.py")
            .start(Path::new("python3"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("dl.py"), "{e}");
    }
}
