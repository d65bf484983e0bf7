//! Polygraphy's JSON files, read and written exactly as Polygraphy 0.53 does:
//!
//! * inputs (`polygraphy run --save-inputs`): a list of feed dicts, `[{name: ndarray}, ...]`;
//! * outputs (`--save-outputs`): a `RunResults`,
//!   `{"lst": [[runner_name, [IterationResult, ...]], ...], "polygraphy_class": "RunResults"}`,
//!   where an `IterationResult` is `{"outputs": {name: LazyArray}, "runtime", "runner_name"}`.
//!
//! Every array is `{"array": base64(np.save bytes), "polygraphy_class": "ndarray"}`; a
//! `LazyArray` wraps one as `{"values": ndarray, "polygraphy_class": "LazyArray"}`. Older files
//! (the `polygraphy_serialized_json_type` marker, `LazyNumpyArray`, latin-1 or `.npz` payloads)
//! load too.

use super::npy::{from_npy, to_npy};
use crate::error::{Error, Result};
use crate::tensor::Feeds;
use crate::tensor::Tensor;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::io::Read;
use std::path::Path;

const TYPE_MARKER: &str = "polygraphy_class";
const LEGACY_MARKER: &str = "polygraphy_serialized_json_type";

/// One iteration of one runner: its outputs in the model's order and the time it took.
#[derive(Clone, Debug)]
pub struct IterationResult {
    pub outputs: Vec<(String, Tensor)>,
    /// Seconds.
    pub runtime: f64,
    pub runner_name: String,
}

/// Results of one or more runners, each a list of iterations (Polygraphy's `RunResults`).
#[derive(Clone, Debug, Default)]
pub struct RunResults {
    pub runners: Vec<(String, Vec<IterationResult>)>,
}

/// The class a JSON object was encoded from, if Polygraphy marked it.
fn class_of(obj: &Map<String, Value>) -> Option<&str> {
    if let Some(Value::String(s)) = obj.get(TYPE_MARKER) {
        return Some(s);
    }
    // Legacy files: `{"<class>": "polygraphy_serialized_json_type", ...}`.
    obj.iter()
        .find(|(_, v)| v.as_str() == Some(LEGACY_MARKER))
        .map(|(k, _)| k.as_str())
}

fn encode_array(t: &Tensor) -> std::result::Result<Value, String> {
    let npy = to_npy(t)?;
    Ok(json!({
        "array": base64::engine::general_purpose::STANDARD.encode(npy),
        TYPE_MARKER: "ndarray",
    }))
}

/// Decodes an `ndarray` or `LazyArray` object; `what` names it in errors.
fn decode_array(v: &Value, what: &str) -> std::result::Result<Tensor, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{what}: expected an encoded array object"))?;
    match class_of(obj) {
        Some("LazyArray") | Some("LazyNumpyArray") => {
            let inner = obj
                .get("values")
                .ok_or_else(|| format!("{what}: LazyArray without 'values'"))?;
            decode_array(inner, what)
        }
        Some("ndarray") | Some("np.ndarray") | Some("numpy.ndarray") => {
            let payload = obj
                .get("array")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{what}: ndarray without an 'array' string"))?;
            let bytes = match base64::engine::general_purpose::STANDARD.decode(payload) {
                Ok(b) => b,
                // Files from old Polygraphy versions store the bytes as latin-1 text.
                Err(_) => payload
                    .chars()
                    .map(|c| u8::try_from(c as u32))
                    .collect::<std::result::Result<Vec<u8>, _>>()
                    .map_err(|_| {
                        format!("{what}: the array payload is neither base64 nor latin-1")
                    })?,
            };
            if bytes.starts_with(b"PK") {
                // Very old files hold an .npz archive with one array.
                return first_npz_array(&bytes).map_err(|e| format!("{what}: {e}"));
            }
            from_npy(&bytes).map_err(|e| format!("{what}: {e}"))
        }
        Some(other) => Err(format!(
            "{what}: expected an array, found a serialized '{other}'"
        )),
        None => Err(format!(
            "{what}: expected an array (an object with \"polygraphy_class\": \"ndarray\")"
        )),
    }
}

fn first_npz_array(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| e.to_string())?;
    if zip.is_empty() {
        return Err("the embedded .npz archive holds no arrays".into());
    }
    let mut entry = zip.by_index(0).map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
    from_npy(&data)
}

/// Reads a Polygraphy JSON file, recognized by its content whatever its name (Polygraphy
/// 0.53 writes JSON to `golden.pkl` too); a pickle, `.npz` or `.npy` is an error saying so.
fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    match super::FileKind::sniff(&bytes[..bytes.len().min(64)]) {
        super::FileKind::Pickle => return Err(super::pickle_error(path)),
        super::FileKind::Npz | super::FileKind::Npy => {
            return Err(Error::data(
                path,
                "a NumPy array file (.npz/.npy), where a Polygraphy JSON file (as written by `--save-inputs`/`--save-outputs`) is expected",
            ))
        }
        super::FileKind::Json | super::FileKind::Unknown => {}
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::data(path, format!("not valid JSON: {e}")))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_vec_pretty(v).map_err(|e| Error::data(path, e.to_string()))?;
    super::write_atomic(path, &text)
}

/// Reads a `--save-inputs` file: a list of feed dicts (one per iteration); or a directory of
/// per-iteration files (each one feed dict, or a list of them).
pub fn load_inputs(path: &Path) -> Result<Vec<Feeds>> {
    if path.is_dir() {
        let mut all = Vec::new();
        for f in iteration_files(path)? {
            let v = read_json(&f)?;
            let v = if v.is_array() {
                v
            } else {
                Value::Array(vec![v])
            };
            all.extend(parse_inputs(&f, &v)?);
        }
        return Ok(all);
    }
    let v = read_json(path)?;
    parse_inputs(path, &v)
}

fn parse_inputs(path: &Path, v: &Value) -> Result<Vec<Feeds>> {
    let not_inputs = || {
        Error::data(
            path,
            "not a Polygraphy inputs file: expected a JSON list of {input name: array} dicts (as written by `--save-inputs`)",
        )
    };
    let list = v.as_array().ok_or_else(not_inputs)?;
    let mut all = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let obj = item.as_object().ok_or_else(not_inputs)?;
        let mut feeds = Feeds::new();
        for (name, arr) in obj {
            let t = decode_array(arr, &format!("iteration {i}, input '{name}'"))
                .map_err(|e| Error::data(path, e))?;
            feeds.insert(name.clone(), t);
        }
        all.push(feeds);
    }
    if all.is_empty() {
        return Err(Error::data(path, "the inputs file holds no input sets"));
    }
    Ok(all)
}

/// Writes a `--save-inputs` file that `polygraphy run --load-inputs` reads; a path without an
/// extension is a new (or empty) directory with one feed dict per file, as Polygraphy 0.53
/// writes it.
pub fn save_inputs(path: &Path, feeds: &[Feeds]) -> Result<()> {
    if !is_single_file(path) {
        prepare_iteration_dir(path, "inputs")?;
        for (i, f) in feeds.iter().enumerate() {
            let p = iteration_file(path, i);
            let list = encode_feeds(&p, std::slice::from_ref(f))?;
            write_json(&p, &list[0])?;
        }
        return Ok(());
    }
    let list = encode_feeds(path, feeds)?;
    write_json(path, &Value::Array(list))
}

fn encode_feeds(path: &Path, feeds: &[Feeds]) -> Result<Vec<Value>> {
    let mut list = Vec::with_capacity(feeds.len());
    for f in feeds {
        let mut obj = Map::new();
        for (name, t) in f {
            let enc =
                encode_array(t).map_err(|e| Error::data(path, format!("input '{name}': {e}")))?;
            obj.insert(name.clone(), enc);
        }
        list.push(Value::Object(obj));
    }
    Ok(list)
}

/// Whether a `--save-inputs`/`--save-outputs` path names one file (it has an extension)
/// rather than a directory of per-iteration files, as Polygraphy 0.53 decides: by the path
/// string alone.
pub fn is_single_file(path: &Path) -> bool {
    path.extension().is_some()
}

/// Width of the zero-padded index of per-iteration file names (`0000000000.json`).
const ITERATION_FILE_INDEX_WIDTH: usize = 10;

/// The `*.json` files of a per-iteration directory, in index (lexical) order.
fn iteration_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::data(
            dir,
            "the directory holds no per-iteration .json files",
        ));
    }
    Ok(files)
}

/// Prepares a directory for per-iteration files: it must not exist, or be an empty directory
/// (nothing is overwritten), as Polygraphy requires.
fn prepare_iteration_dir(dir: &Path, what: &str) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(Error::data(
                dir,
                format!("cannot save {what} here: a file exists, but a path without an extension is a directory of per-iteration files (use a path with an extension, e.g. .json, for one file)"),
            ));
        }
        if std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .next()
            .is_some()
        {
            return Err(Error::data(
                dir,
                format!("cannot save {what} here: the directory is not empty (per-iteration files need an empty or new directory)"),
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
}

fn iteration_file(dir: &Path, index: usize) -> std::path::PathBuf {
    dir.join(format!(
        "{index:0width$}.json",
        width = ITERATION_FILE_INDEX_WIDTH
    ))
}

/// Reads a `RunResults` JSON (`polygraphy run --save-outputs`), or a directory of
/// per-iteration `RunResults` files (`--save-outputs DIR`), concatenated by runner name.
pub fn load_run_results(path: &Path) -> Result<RunResults> {
    if path.is_dir() {
        let mut all = RunResults::default();
        for f in iteration_files(path)? {
            let v = read_json(&f)?;
            let one = parse_run_results(&v).map_err(|e| Error::data(&f, e))?;
            all.concat(one);
        }
        return Ok(all);
    }
    let v = read_json(path)?;
    parse_run_results(&v).map_err(|e| Error::data(path, e))
}

impl RunResults {
    /// Appends `other`'s iterations to the runner of the same name (Polygraphy's
    /// `RunResults.concat`).
    pub fn concat(&mut self, other: RunResults) {
        for (name, iters) in other.runners {
            match self.runners.iter_mut().find(|(n, _)| *n == name) {
                Some((_, mine)) => mine.extend(iters),
                None => self.runners.push((name, iters)),
            }
        }
    }

    /// One single-iteration `RunResults` per iteration (Polygraphy's `RunResults.split`).
    pub fn split(&self) -> Vec<RunResults> {
        let n = self.runners.iter().map(|(_, i)| i.len()).max().unwrap_or(0);
        (0..n)
            .map(|i| RunResults {
                runners: self
                    .runners
                    .iter()
                    .filter_map(|(name, iters)| {
                        iters.get(i).map(|it| (name.clone(), vec![it.clone()]))
                    })
                    .collect(),
            })
            .collect()
    }
}

fn parse_run_results(v: &Value) -> std::result::Result<RunResults, String> {
    let obj = v.as_object().filter(|o| class_of(o) == Some("RunResults")).ok_or(
        "not a Polygraphy RunResults file: expected an object with \"polygraphy_class\": \"RunResults\" (as written by `--save-outputs`)",
    )?;
    let lst = obj
        .get("lst")
        .and_then(Value::as_array)
        .ok_or("RunResults without a 'lst' list")?;
    let mut runners = Vec::with_capacity(lst.len());
    for (r, entry) in lst.iter().enumerate() {
        let pair = entry.as_array().filter(|p| p.len() == 2).ok_or_else(|| {
            format!("RunResults entry #{r}: expected [runner_name, [iterations]]")
        })?;
        let runner = pair[0]
            .as_str()
            .ok_or_else(|| format!("RunResults entry #{r}: the runner name is not a string"))?
            .to_string();
        let iters = pair[1]
            .as_array()
            .ok_or_else(|| format!("runner '{runner}': expected a list of iteration results"))?;
        let mut out = Vec::with_capacity(iters.len());
        for (i, it) in iters.iter().enumerate() {
            let o = it
                .as_object()
                .filter(|o| class_of(o) == Some("IterationResult"))
                .ok_or_else(|| {
                    format!("runner '{runner}', iteration {i}: not an IterationResult")
                })?;
            let outputs = o
                .get("outputs")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("runner '{runner}', iteration {i}: no 'outputs' dict"))?;
            let mut outs = Vec::with_capacity(outputs.len());
            for (name, arr) in outputs {
                if name == TYPE_MARKER {
                    continue;
                }
                let t = decode_array(
                    arr,
                    &format!("runner '{runner}', iteration {i}, output '{name}'"),
                )?;
                outs.push((name.clone(), t));
            }
            out.push(IterationResult {
                outputs: outs,
                runtime: o.get("runtime").and_then(Value::as_f64).unwrap_or(0.0),
                runner_name: o
                    .get("runner_name")
                    .and_then(Value::as_str)
                    .unwrap_or(&runner)
                    .to_string(),
            });
        }
        runners.push((runner, out));
    }
    Ok(RunResults { runners })
}

/// Writes a `RunResults` JSON that `polygraphy run --load-outputs` reads; a path without an
/// extension is a new (or empty) directory with one single-iteration `RunResults` per file
/// (`0000000000.json`, ...), as Polygraphy 0.53 writes it.
pub fn save_run_results(path: &Path, results: &RunResults) -> Result<()> {
    if !is_single_file(path) {
        prepare_iteration_dir(path, "results")?;
        for (i, one) in results.split().iter().enumerate() {
            let p = iteration_file(path, i);
            write_json(&p, &encode_run_results(&p, one)?)?;
        }
        return Ok(());
    }
    write_json(path, &encode_run_results(path, results)?)
}

fn encode_run_results(path: &Path, results: &RunResults) -> Result<Value> {
    let mut lst = Vec::with_capacity(results.runners.len());
    for (runner, iters) in &results.runners {
        let mut its = Vec::with_capacity(iters.len());
        for it in iters {
            let mut outs = Map::new();
            for (name, t) in &it.outputs {
                let arr = encode_array(t)
                    .map_err(|e| Error::data(path, format!("output '{name}': {e}")))?;
                outs.insert(
                    name.clone(),
                    json!({ "values": arr, TYPE_MARKER: "LazyArray" }),
                );
            }
            its.push(json!({
                "outputs": Value::Object(outs),
                "runtime": it.runtime,
                "runner_name": it.runner_name,
                TYPE_MARKER: "IterationResult",
            }));
        }
        lst.push(json!([runner, its]));
    }
    Ok(json!({ "lst": lst, TYPE_MARKER: "RunResults" }))
}

/// The local date and time as Polygraphy's `time.strftime('%x')-time.strftime('%X')` in the C
/// locale: `MM/DD/YY-HH:MM:SS`.
pub fn runner_stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: localtime_r writes into the zeroed struct we own; `now` outlives the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            let secs = now as i64;
            tm.tm_hour = ((secs / 3600) % 24) as i32;
            tm.tm_min = ((secs / 60) % 60) as i32;
            tm.tm_sec = (secs % 60) as i32;
        }
        tm
    };
    format!(
        "{:02}/{:02}/{:02}-{:02}:{:02}:{:02}",
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_year.rem_euclid(100),
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RunResults {
        RunResults {
            runners: vec![(
                "r".into(),
                vec![IterationResult {
                    outputs: vec![
                        ("z".into(), Tensor::from_f32(vec![2], vec![1.0, 2.0])),
                        ("a".into(), Tensor::from_i64(vec![1], vec![7])),
                    ],
                    runtime: 0.5,
                    runner_name: "r".into(),
                }],
            )],
        }
    }

    #[test]
    fn run_results_round_trip_keeps_output_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        save_run_results(&p, &sample()).unwrap();
        let back = load_run_results(&p).unwrap();
        let it = &back.runners[0].1[0];
        assert_eq!(it.outputs[0].0, "z");
        assert_eq!(it.outputs[1].1.to_i64_vec().unwrap(), vec![7]);
        assert_eq!(it.runtime, 0.5);
    }

    #[test]
    fn reads_legacy_markers_and_plain_ndarrays() {
        let arr = encode_array(&Tensor::from_f32(vec![1], vec![3.0])).unwrap();
        let legacy = json!({
            "lst": [["old", [{
                "outputs": {"y": {"values": arr, "LazyNumpyArray": LEGACY_MARKER}},
                "runtime": 1.0, "runner_name": "old",
                "IterationResult": LEGACY_MARKER,
            }]]],
            "RunResults": LEGACY_MARKER,
        });
        let r = parse_run_results(&legacy).unwrap();
        assert_eq!(
            r.runners[0].1[0].outputs[0].1.to_f64_vec().unwrap(),
            vec![3.0]
        );
    }

    #[test]
    fn directory_form_round_trips_per_iteration() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = sample();
        let mut second = r.runners[0].1[0].clone();
        second.runtime = 0.25;
        r.runners[0].1.push(second);
        let p = dir.path().join("outs");
        save_run_results(&p, &r).unwrap();
        let names: Vec<String> = std::fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(names, vec!["0000000000.json", "0000000001.json"]);
        let back = load_run_results(&p).unwrap();
        assert_eq!(back.runners.len(), 1);
        assert_eq!(back.runners[0].1.len(), 2);
        assert_eq!(back.runners[0].1[1].runtime, 0.25);
        // A non-empty directory is refused; nothing is overwritten.
        let e = save_run_results(&p, &r).unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
    }

    #[test]
    fn rejects_other_json_with_a_reason() {
        let e = parse_run_results(&json!({"hello": [1, 2]})).unwrap_err();
        assert!(e.contains("RunResults"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.json");
        std::fs::write(&p, "{\"x\": 1}").unwrap();
        let e = load_inputs(&p).unwrap_err().to_string();
        assert!(e.contains("in.json") && e.contains("list"), "{e}");
        std::fs::write(
            &p,
            "[{\"x\": {\"array\": \"!!\", \"polygraphy_class\": \"ndarray\"}}]",
        )
        .unwrap();
        let e = load_inputs(&p).unwrap_err().to_string();
        assert!(e.contains("input 'x'"), "{e}");
    }
}
