//! End-to-end `mixprec calibrate`: a TensorRT cache from generated data, and bad input.

use crate::common::{example, mixprec, text};
use mixprec::calib::CalibrationCache;
use mixprec::data::{npz, polygraphy};
use mixprec::exec::Feeds;
use mixprec::Tensor;

#[test]
fn calibrate_writes_a_tensorrt_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache_path = tmp.path().join("transformer.cache");
    let cache_arg = cache_path.to_string_lossy().into_owned();
    let o = mixprec(&[
        "calibrate",
        &example("transformer.onnx"),
        "--val-range",
        "[-1,1]",
        "--iterations",
        "4",
        "--algo",
        "entropy",
        "--cache",
        &cache_arg,
        "--verbose",
    ]);
    assert!(o.status.success(), "mixprec calibrate: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("over 4 batch(es)"), "{out}");

    let cache = CalibrationCache::read(&cache_path).unwrap();
    assert_eq!(cache.header, "TRT-8601-EntropyCalibration2");
    let body = std::fs::read_to_string(&cache_path).unwrap();
    let first_entry = body.lines().nth(1).unwrap();
    assert!(
        first_entry.starts_with("tokens: ") && first_entry.len() == "tokens: ".len() + 8,
        "{first_entry}"
    );
    // The input in [-1, 1]: entropy keeps (nearly) the whole uniform range.
    let amax = cache.amax("tokens").unwrap();
    assert!(amax > 0.9 && amax <= 1.0, "tokens amax {amax}");
    // Intermediate tensors: every node output of the transformer, not just its ends.
    let intermediates: Vec<&str> = cache
        .scales
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "tokens" && *n != "hidden")
        .collect();
    assert!(intermediates.len() >= 20, "{intermediates:?}");
    assert!(
        intermediates.iter().any(|n| n.contains("Softmax")),
        "{intermediates:?}"
    );
    assert!(cache.scale("hidden").is_some());
    for (name, scale) in &cache.scales {
        assert!(*scale > 0.0 && scale.is_finite(), "{name}: {scale}");
    }

    // minmax gives max |x| for the input, and ranges at least as wide as entropy's.
    let mm_path = tmp.path().join("minmax.cache");
    let o = mixprec(&[
        "calibrate",
        &example("transformer.onnx"),
        "--val-range",
        "[-1,1]",
        "--iterations",
        "4",
        "--algo",
        "minmax",
        "--cache",
        &mm_path.to_string_lossy(),
    ]);
    assert!(
        o.status.success(),
        "mixprec calibrate --algo minmax: {}",
        text(&o)
    );
    let mm = CalibrationCache::read(&mm_path).unwrap();
    assert_eq!(mm.header, "TRT-8601-MinMaxCalibration");
    assert_eq!(mm.len(), cache.len());
    for (name, amax) in cache.amax_map() {
        let m = mm.amax(&name).unwrap();
        assert!(amax <= m * 1.0001, "{name}: entropy {amax} > minmax {m}");
    }

    // --data: an .npz batch and a Polygraphy JSON with two batches; minmax amax of the input
    // is exactly max |x| over all of them.
    let npz_path = tmp.path().join("batch.npz");
    let v: Vec<f32> = (0..32 * 64)
        .map(|i| ((i % 97) as f32 - 48.0) / 16.0)
        .collect();
    npz::write_npz(
        &npz_path,
        &[("tokens".to_string(), Tensor::from_f32(vec![1, 32, 64], v))],
    )
    .unwrap();
    let json_path = tmp.path().join("batches.json");
    let mut f = Feeds::new();
    f.insert(
        "tokens".into(),
        Tensor::from_f32(vec![1, 32, 64], vec![0.25; 32 * 64]),
    );
    polygraphy::save_inputs(&json_path, &[f.clone(), f]).unwrap();
    let o = mixprec(&[
        "calibrate",
        &example("transformer.onnx"),
        "--data",
        &npz_path.to_string_lossy(),
        &json_path.to_string_lossy(),
        "--algo",
        "minmax",
        "--cache",
        &mm_path.to_string_lossy(),
    ]);
    assert!(o.status.success(), "mixprec calibrate --data: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("over 3 batch(es)"));
    let mm = CalibrationCache::read(&mm_path).unwrap();
    assert_eq!(mm.scale("tokens"), Some(3.0 / 127.0));
}

#[test]
fn calibrate_reports_bad_data_and_bad_caches() {
    let tmp = tempfile::tempdir().unwrap();
    let cache_path = tmp.path().join("out.cache");
    let cache_arg = cache_path.to_string_lossy().into_owned();

    // Wrong shape for `tokens` (declared [1, 32, 64]), as .npz.
    let bad_npz = tmp.path().join("bad_shape.npz");
    let t = Tensor::from_f32(vec![1, 3, 64], vec![0.5; 3 * 64]);
    npz::write_npz(&bad_npz, &[("tokens".to_string(), t)]).unwrap();
    // A wrong input name, as Polygraphy JSON with two input sets.
    let wrong_name = tmp.path().join("wrong_name.json");
    let mut f = Feeds::new();
    f.insert(
        "x".into(),
        Tensor::from_f32(vec![1, 32, 64], vec![0.5; 32 * 64]),
    );
    polygraphy::save_inputs(&wrong_name, &[f.clone(), f]).unwrap();
    for (file, want) in [
        (&bad_npz, "expected shape [1, 32, 64], got (1, 3, 64)"),
        (
            &wrong_name,
            "input set 0: input 'x': the model has no such input",
        ),
    ] {
        let o = mixprec(&[
            "calibrate",
            &example("transformer.onnx"),
            "--data",
            &file.to_string_lossy(),
            "--cache",
            &cache_arg,
        ]);
        assert!(!o.status.success(), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        let name = file.file_name().unwrap().to_string_lossy();
        assert!(
            err.lines()
                .any(|l| l.starts_with("error:") && l.contains(&*name) && l.contains(want)),
            "{err}"
        );
        assert!(!cache_path.exists(), "no cache is written on failure");
    }

    // A malformed cache fed to the library reader names the file and line.
    let bad_cache = tmp.path().join("broken.cache");
    std::fs::write(
        &bad_cache,
        "TRT-8601-EntropyCalibration2\ntokens 3c010204\n",
    )
    .unwrap();
    let e = CalibrationCache::read(&bad_cache).unwrap_err().to_string();
    assert!(e.contains("broken.cache") && e.contains("line 2"), "{e}");

    // An unknown algorithm is a one-line error with a non-zero exit.
    let o = mixprec(&[
        "calibrate",
        &example("transformer.onnx"),
        "--algo",
        "mse",
        "--cache",
        &cache_arg,
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("error:") && err.contains("mse"), "{err}");
}
