//! Fault injection for the child processes `debug precision` starts (issue 47): `--check`
//! commands whose grandchildren hold the pipes, that ignore SIGTERM, die by a signal or print
//! hundreds of MB; data-loader scripts that hang or crash; mixprec itself interrupted by
//! SIGINT, SIGTERM or SIGKILL mid-search and resumed from its debug replay; a file size
//! limit while files are written. Every test runs mixprec with a unique marker in its
//! environment, which every process it starts inherits, and ends by checking that no process
//! carrying the marker is left (`assert_none_left`).
//!
//! The model is examples/mlp.onnx (6 candidate layers); the check scripts pass exactly when
//! `/Gemm_1` runs in float32. Timing bounds are generous (a 2-core machine): they tell a
//! search that returned from one that waited for a 30 s child.

use crate::common::{example, python, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MARK_VAR: &str = "MIXPREC_FAULT_MARK";

/// A marker no other test (or run) shares.
fn new_mark(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

/// `debug precision mlp.onnx --fp16` and `extra`, as a command carrying `mark`.
fn search_cmd(mark: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mixprec"));
    c.args([
        "debug",
        "precision",
        &example("mlp.onnx"),
        "--fp16",
        "--input-shapes",
        "x:[1,64]",
    ])
    .args(extra)
    .env(MARK_VAR, mark)
    .env("MIXPREC_PYTHON", python())
    .env("NO_COLOR", "1")
    .stdin(Stdio::null());
    c
}

/// Runs it to the end; (output, seconds it took).
fn run(mut c: Command) -> (Output, f64) {
    let t0 = Instant::now();
    let out = c.output().expect("run mixprec");
    (out, t0.elapsed().as_secs_f64())
}

/// Live processes (not zombies) whose environment holds `mark`, as `pid cmdline`.
fn leftovers(mark: &str) -> Vec<String> {
    let needle = format!("{MARK_VAR}={mark}\0");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if !env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("Z");
        if state == "Z" || state == "X" {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        found.push(format!(
            "{name} {}",
            String::from_utf8_lossy(&cmd).replace('\0', " ")
        ));
    }
    found
}

/// No process started under `mark` is alive (waiting up to 10 s: after a `kill -9` of
/// mixprec its guards end the groups, SIGTERM then SIGKILL 2 s later).
fn assert_none_left(mark: &str) {
    let t0 = Instant::now();
    loop {
        let left = leftovers(mark);
        if left.is_empty() {
            return;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            panic!("processes left behind: {left:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An executable bash script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Bash that passes exactly when `/Gemm_1` is in float32 (`$1` is
/// `{trtexec_layer_precisions}`).
const VERDICT: &str = "case \",$1,\" in *,/Gemm_1:fp32,*) exit 0;; *) exit 1;; esac";

#[test]
fn a_timeout_kills_the_group_even_when_a_grandchild_holds_the_pipes() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("timeout");
    // The cases: the work in a child, and in a background child holding the pipes
    // after the script itself exited 0 (judged PASSED after 20 s each before).
    for (name, body) in [
        ("child.sh", "sleep 30\nexit 0"),
        ("background.sh", "sleep 30 &\nexit 0"),
    ] {
        let s = script(tmp.path(), name, body);
        let (out, secs) = run(search_cmd(
            &mark,
            &["--check-timeout", "1", "--check", s.to_str().unwrap()],
        ));
        let log = text(&out);
        assert!(!out.status.success(), "{log}");
        assert!(log.contains("--check timed out after 1."), "{log}");
        assert!(log.contains("its process group was killed"), "{log}");
        assert!(!log.contains("PASSED"), "{log}");
        assert!(secs < 10.0, "{name}: {secs} s\n{log}");
        assert_none_left(&mark);
    }
    // A worker that leaves the pipes and outlives the script is ended with its group once
    // the check is over.
    let s = script(
        tmp.path(),
        "daemon.sh",
        &format!("(sleep 30 >/dev/null 2>&1 &)\n{VERDICT}"),
    );
    let (out, secs) = run(search_cmd(
        &mark,
        &["--check", s.to_str().unwrap(), "{trtexec_layer_precisions}"],
    ));
    assert!(out.status.success(), "{}", text(&out));
    assert!(secs < 20.0, "{secs} s");
    assert_none_left(&mark);
}

#[test]
fn a_check_that_ignores_sigterm_is_killed_after_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("ignore-term");
    // The ignored disposition is inherited: the sleeping child ignores SIGTERM too.
    let s = script(tmp.path(), "stubborn.sh", "trap '' TERM\nsleep 30\nexit 0");
    let (out, secs) = run(search_cmd(
        &mark,
        &["--check-timeout", "1", "--check", s.to_str().unwrap()],
    ));
    let log = text(&out);
    assert!(log.contains("--check timed out after 1."), "{log}");
    assert!(secs < 12.0, "{secs} s\n{log}");
    assert_none_left(&mark);
}

#[test]
fn a_check_killed_by_a_signal_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("signal");
    let s = script(tmp.path(), "crash.sh", "kill -SEGV $$");
    let (out, _) = run(search_cmd(&mark, &["--check", s.to_str().unwrap()]));
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("--check was killed by signal 11 (SIGSEGV"),
        "{log}"
    );
    assert_none_left(&mark);
}

/// Peak RSS (KiB) of a finished child, from wait4.
fn run_measured(mut c: Command, stdout: &Path) -> (i32, i64) {
    let f = std::fs::File::create(stdout).unwrap();
    let child = c
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .expect("run mixprec");
    let pid = child.id() as libc::pid_t;
    // Reaped by wait4 below (for its rusage), not by `Child::wait`.
    std::mem::forget(child);
    let mut status = 0;
    // SAFETY: waiting for our own child with valid out-pointers.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        usage
    };
    (status, usage.ru_maxrss)
}

#[test]
fn a_check_that_prints_hundreds_of_mb_keeps_memory_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("output");
    // 256 MiB of build log, then a failing exit: the output is shown (failing candidate).
    let s = script(
        tmp.path(),
        "chatty.sh",
        "yes '[V] [TRT] building engine: tactic 0x0000000000000001 selected, 0.1234 ms' | head -c 268435456\necho LAST-LINE\nexit 1",
    );
    let log_path = tmp.path().join("log.txt");
    let (status, rss_kib) = run_measured(
        search_cmd(&mark, &["--check", s.to_str().unwrap()]),
        &log_path,
    );
    assert_ne!(status, 0);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.len() < 4 << 20, "{} bytes printed", log.len());
    assert!(
        log.contains("of stdout dropped; the last"),
        "{}",
        &log[..2000]
    );
    assert!(log.contains("LAST-LINE"));
    // Before: the whole output was held, twice (810 MB for 400 MB).
    assert!(rss_kib < 150 << 10, "peak RSS {rss_kib} KiB");
    // --fail-regex still sees a line that was dropped.
    let s = script(
        tmp.path(),
        "mismatch.sh",
        "echo 'output 0: MISMATCH'\nyes 'filler line' | head -c 4000000\nexit 0",
    );
    let (out, _) = run(search_cmd(
        &mark,
        &[
            "--fail-regex",
            "MISMATCH",
            "--hide-fail-output",
            "--check",
            s.to_str().unwrap(),
        ],
    ));
    let log = text(&out);
    assert!(log.contains("matched --fail-regex: 'MISMATCH'"), "{log}");
    assert_none_left(&mark);
}

/// The trials of a `--save-result` file as (phase, marked, passed).
fn trials(result: &Path) -> Vec<(String, Vec<u64>, bool)> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(result).unwrap()).unwrap();
    v["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["phase"].as_str().unwrap().to_string(),
                t["marked"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_u64().unwrap())
                    .collect(),
                t["passed"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn jobs_with_timeouts_and_crashes_give_the_answer_of_one_job() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("jobs");
    // Failing candidates fail three ways, by their size: a timeout, a crash, a status.
    let s = script(
        tmp.path(),
        "mixed.sh",
        "case \",$1,\" in *,/Gemm_1:fp32,*) sleep 0.2; exit 0;; esac\n\
         case $(($2 % 3)) in 0) sleep 30;; 1) kill -SEGV $$;; *) exit 1;; esac",
    );
    let mut answers = Vec::new();
    for jobs in ["1", "3"] {
        let result = tmp.path().join(format!("result{jobs}.json"));
        let (out, _) = run(search_cmd(
            &mark,
            &[
                "--jobs",
                jobs,
                "--save-result",
                result.to_str().unwrap(),
                "--check-timeout",
                "1",
                "--check",
                s.to_str().unwrap(),
                "{trtexec_layer_precisions}",
                "{marked_count}",
            ],
        ));
        let log = text(&out);
        assert!(out.status.success(), "{log}");
        assert!(log.contains("Layers: /Gemm, /Relu, /Gemm_1"), "{log}");
        answers.push(trials(&result));
    }
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].iter().any(|t| !t.2), "{:?}", answers[0]);
    assert_none_left(&mark);
}

/// A data-loader script for mlp.onnx (input x: [batch, 64]).
fn loader(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("dl.py");
    std::fs::write(&p, format!("import numpy as np\n{body}\n")).unwrap();
    p
}

#[test]
fn a_data_loader_that_hangs_is_ended_by_ctrl_c() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("loader-hang");
    let started = tmp.path().join("started");
    let dl = loader(
        tmp.path(),
        &format!(
            "import subprocess, time\n\
             def load_data():\n\
             \x20   subprocess.Popen(['sleep', '60'])\n\
             \x20   open({:?}, 'w').close()\n\
             \x20   time.sleep(60)\n\
             \x20   yield {{'x': np.zeros((1, 64), np.float32)}}",
            started.display().to_string()
        ),
    );
    let mut c = search_cmd(
        &mark,
        &[
            "--data-loader-script",
            dl.to_str().unwrap(),
            "--check",
            "true",
        ],
    );
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !started.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the loader never ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t1 = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(t1.elapsed() < Duration::from_secs(8), "{:?}", t1.elapsed());
    assert_none_left(&mark);
}

#[test]
fn a_data_loader_that_crashes_names_the_script_and_its_traceback() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("loader-crash");
    let dl = loader(
        tmp.path(),
        "import subprocess\n\
         def load_data():\n\
         \x20   subprocess.Popen(['sleep', '60'])\n\
         \x20   yield {'x': np.zeros((1, 64), np.float32)}\n\
         \x20   raise RuntimeError('corrupt shard 7')",
    );
    let (out, secs) = run(search_cmd(
        &mark,
        &[
            "--data-loader-script",
            dl.to_str().unwrap(),
            "--iterations",
            "5",
            "--check",
            "true",
        ],
    ));
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("dl.py:load_data"), "{log}");
    assert!(log.contains("Traceback"), "{log}");
    assert!(log.contains("RuntimeError: corrupt shard 7"), "{log}");
    assert!(secs < 20.0, "{secs} s");
    assert_none_left(&mark);
}

/// The sets a check log lists (one `{trtexec_layer_precisions}` a line), as sorted names.
fn logged_sets(log: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut names: Vec<String> = l
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.trim_end_matches(":fp32").to_string())
                .collect();
            names.sort();
            names
        })
        .collect()
}

/// The sets a debug replay holds, as sorted names.
fn replay_sets(replay: &Path) -> Vec<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(replay).unwrap())
        .unwrap_or_else(|e| panic!("the replay does not parse: {e}"));
    v["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut names: Vec<String> = e["marked"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect();
            names.sort();
            names
        })
        .collect()
}

/// Interrupts a search with `signal` while its third check runs (the first two verdicts are
/// in the replay), then resumes it from the replay: nothing judged is judged again and the
/// trials are those of a search never interrupted.
fn interrupt_and_resume(signal: i32, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark(name);
    let log = tmp.path().join("checks.log");
    // With MIXPREC_FAULT_SLOW set, the third check and later take 30 s (in a child); the
    // environment is not part of the replay's settings, the command is.
    let s = script(
        tmp.path(),
        "check.sh",
        &format!(
            "echo \"$1\" >> {log}\n\
             if [ -n \"$MIXPREC_FAULT_SLOW\" ] && [ $(wc -l < {log}) -ge 3 ]; then sleep 30; fi\n\
             {VERDICT}",
            log = log.display()
        ),
    );
    let replay = tmp.path().join("replay.json");
    let replay_s = replay.to_str().unwrap();
    let check = [
        "--mode",
        "linear",
        "--check",
        s.to_str().unwrap(),
        "{trtexec_layer_precisions}",
    ];
    // The search never interrupted.
    let reference = tmp.path().join("reference.json");
    let mut args = vec!["--save-result", reference.to_str().unwrap()];
    args.extend(check);
    let (out, _) = run(search_cmd(&mark, &args));
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(&log).unwrap();

    let mut args = vec!["--save-debug-replay", replay_s];
    args.extend(check);
    let mut c = search_cmd(&mark, &args);
    let out_path = tmp.path().join("interrupted.txt");
    let f = std::fs::File::create(&out_path).unwrap();
    let mut child = c
        .env("MIXPREC_FAULT_SLOW", "1")
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while logged_sets(&log).len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no third check");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let t1 = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    let waited = t1.elapsed();
    let printed = std::fs::read_to_string(&out_path).unwrap();
    if signal == libc::SIGKILL {
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    } else {
        // Within a second plus the grace (2 s), generously.
        assert!(waited < Duration::from_secs(8), "{waited:?}\n{printed}");
        assert_eq!(status.code(), Some(130), "{printed}");
        assert!(printed.contains("Interrupted after"), "{printed}");
        assert!(printed.contains("Saved debug replay"), "{printed}");
    }
    // Complete and parseable (written by temporary file + rename after every verdict); the
    // interrupted check's verdict is not in it.
    let recorded = replay_sets(&replay);
    assert_eq!(recorded.len(), 2, "{recorded:?}\n{printed}");
    assert_none_left(&mark);

    // Resume: the recorded candidates are answered from the replay, not judged again.
    std::fs::remove_file(&log).unwrap();
    let result = tmp.path().join("resumed.json");
    let mut args = vec![
        "--load-debug-replay",
        replay_s,
        "--save-debug-replay",
        replay_s,
        "--save-result",
        result.to_str().unwrap(),
    ];
    args.extend(check);
    let (out, _) = run(search_cmd(&mark, &args));
    let resumed_log = text(&out);
    assert!(out.status.success(), "{resumed_log}");
    assert!(
        resumed_log.contains("2 candidate(s) answered from the debug replay"),
        "{resumed_log}"
    );
    let judged_again: Vec<_> = logged_sets(&log)
        .into_iter()
        .filter(|s| recorded.contains(s))
        .collect();
    assert!(judged_again.is_empty(), "{judged_again:?}");
    assert_eq!(trials(&result), trials(&reference));
    assert_none_left(&mark);
}

#[test]
fn sigint_mid_search_stops_the_checks_and_resumes_from_the_replay() {
    interrupt_and_resume(libc::SIGINT, "sigint");
}

#[test]
fn sigterm_mid_search_stops_the_checks_and_resumes_from_the_replay() {
    interrupt_and_resume(libc::SIGTERM, "sigterm");
}

#[test]
fn sigkill_mid_search_leaves_a_replay_to_resume_and_no_process() {
    interrupt_and_resume(libc::SIGKILL, "sigkill");
}

#[test]
fn a_file_size_limit_leaves_no_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = new_mark("fsize");
    let d = tmp.path();
    let out_model = d.join("out.onnx");
    let replay = d.join("replay.json");
    // RLIMIT_FSIZE of 16 KiB (bash counts in KiB): the debug replay fits, the 70 KB model
    // does not. mixprec ignores SIGXFSZ, so the write fails with EFBIG.
    let c = search_cmd(
        &mark,
        &[
            "--save-debug-replay",
            replay.to_str().unwrap(),
            "-o",
            out_model.to_str().unwrap(),
        ],
    );
    let program = c.get_program().to_owned();
    let args: Vec<_> = c.get_args().map(|a| a.to_owned()).collect();
    let mut limited = Command::new("bash");
    limited
        .arg("-c")
        .arg("ulimit -f \"$1\"; shift; exec \"$@\"")
        .arg("limit")
        .arg("16")
        .arg(program)
        .args(args)
        .env(MARK_VAR, &mark);
    let (out, _) = run(limited);
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("out.onnx"), "{log}");
    assert!(!out_model.exists(), "a partial model was left");
    replay_sets(&replay);
    let names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp-")),
        "temporary files left: {names:?}"
    );
    assert_none_left(&mark);
}
