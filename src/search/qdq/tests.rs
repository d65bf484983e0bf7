use super::*;
use crate::event::Event;
use crate::export::qdq::tests::{i8s, index, model, node, x_feed};
use crate::search::driver::{run_search as drive, SearchJob, SearchRun};
use crate::search::SearchOptions;
use crate::search::{Direction, Mode, Objective, Trial};
use crate::tensor::TensorData;
use std::sync::atomic::AtomicBool;

/// A finished Q/DQ search, its answer unpacked.
struct QdqRun {
    space: SearchSpace,
    result: SearchResult,
    stats: SearchStats,
    answer: Option<Box<Stripped>>,
    reasons: Vec<QdqReason>,
}

impl From<SearchRun> for QdqRun {
    fn from(run: SearchRun) -> QdqRun {
        let Found::Qdq {
            answer, reasons, ..
        } = run.found
        else {
            panic!("a Q/DQ model's search answers Q/DQ layers")
        };
        QdqRun {
            space: run.space,
            result: run.result,
            stats: run.stats,
            answer,
            reasons,
        }
    }
}

fn i16s(shape: &[usize], v: Vec<i16>) -> Tensor {
    Tensor::from_parts(shape.to_vec(), TensorData::I16(v.into()))
}

/// x → [Q/DQ int16] → mm_a → [Q/DQ int16] → mm_b → [Q/DQ int8, scale 0.5] → mm_c → y: the
/// last activation is quantized far too coarsely (a badly calibrated range), the others finely.
fn planted() -> Model {
    planted_with(0.5)
}

/// [`planted`] with the last activation's int8 scale `coarse`.
fn planted_with(coarse: f32) -> Model {
    let pair = |name: &str, x: &str, s: &str, z: &str, out: &str| {
        vec![
            node(
                "QuantizeLinear",
                &format!("{name}_q"),
                &[x, s, z],
                &[&format!("{out}_q")],
            ),
            node(
                "DequantizeLinear",
                &format!("{name}_dq"),
                &[&format!("{out}_q"), s, z],
                &[out],
            ),
        ]
    };
    let mut nodes = Vec::new();
    nodes.extend(pair("in", "x", "fine", "z16", "xd"));
    nodes.push(node("DequantizeLinear", "wa_dq", &["wa", "ws"], &["wad"]));
    nodes.push(node("MatMul", "mm_a", &["xd", "wad"], &["ha"]));
    nodes.extend(pair("ha", "ha", "fine", "z16", "had"));
    nodes.push(node("DequantizeLinear", "wb_dq", &["wb", "ws"], &["wbd"]));
    nodes.push(node("MatMul", "mm_b", &["had", "wbd"], &["hb"]));
    nodes.extend(pair("hb", "hb", "coarse", "z8", "hbd"));
    nodes.push(node("DequantizeLinear", "wc_dq", &["wc", "ws"], &["wcd"]));
    nodes.push(node("MatMul", "mm_c", &["hbd", "wcd"], &["y"]));
    let w = |n: usize, k: i8| i8s(&[4, n], (0..4 * n).map(|i| (i as i8 % 7) * k - 9).collect());
    model(
        nodes,
        vec![
            ("fine", Tensor::scalar_f32(1e-3)),
            ("z16", i16s(&[], vec![0])),
            ("coarse", Tensor::scalar_f32(coarse)),
            ("z8", i8s(&[], vec![0])),
            ("ws", Tensor::scalar_f32(0.1)),
            ("wa", w(4, 3)),
            ("wb", w(4, 2)),
            ("wc", w(3, 4)),
        ],
        &["y"],
    )
}

#[derive(Default)]
struct Recorder {
    started: Vec<usize>,
    trials: usize,
    events: Vec<String>,
}

impl SearchHooks for Recorder {
    fn event(&mut self, e: Event) {
        self.events.push(format!("{e:?}"));
    }
    fn started(&mut self, space: &SearchSpace) {
        self.started.push(space.candidates.len());
    }
    fn trial(&mut self, _space: &SearchSpace, _t: &Trial) {
        self.trials += 1;
    }
    fn log(&mut self, _line: String) {}
}

fn search_planted(mode: Mode, direction: Direction, high: Precision) -> (Model, QdqRun) {
    search_planted_jobs(mode, direction, high, 1)
}

fn search_planted_jobs(
    mode: Mode,
    direction: Direction,
    high: Precision,
    jobs: usize,
) -> (Model, QdqRun) {
    search_model(planted(), mode, direction, high, jobs)
}

fn search_model(
    m: Model,
    mode: Mode,
    direction: Direction,
    high: Precision,
    jobs: usize,
) -> (Model, QdqRun) {
    let criterion = Criterion {
        atol: crate::compare::PerOutput::new(0.05),
        rtol: crate::compare::PerOutput::new(0.0),
        ..Default::default()
    };
    let (run, hooks) = run_search(&m, criterion, mode, direction, high, jobs);
    let run = run.unwrap();
    assert_eq!(hooks.started, vec![3]);
    assert_eq!(hooks.trials, run.result.trials.len());
    assert!(hooks.events.is_empty(), "{:?}", hooks.events);
    (m, run)
}

/// One Q/DQ search on `m` over [`x_feed`], no fusion, golden outputs or `--check`.
fn run_search(
    m: &Model,
    criterion: Criterion,
    mode: Mode,
    direction: Direction,
    high: Precision,
    jobs: usize,
) -> (Result<QdqRun>, Recorder) {
    let feeds = vec![x_feed()];
    let stop = AtomicBool::new(false);
    let mut hooks = Recorder::default();
    let run = QdqSpace::new(QdqSpaceConfig {
        model: m,
        feeds: &feeds,
        criterion,
        user: None,
        high,
        fusion: FusionModel::None,
    })
    .and_then(|mut space| {
        let job = SearchJob {
            graph: &m.graph,
            golden: None,
            options: SearchOptions {
                mode,
                direction,
                objective: Objective::Layers,
                ranking: crate::search::Ranking::Growth,
                jobs,
                group: crate::search::Grouping::None,
            },
            check: None,
            remote: None,
            replay: None,
            layer_errors: false,
            stop: &stop,
        };
        drive(&mut space, job, &mut hooks)
    })
    .map(QdqRun::from);
    (run, hooks)
}

#[test]
fn every_mode_finds_the_badly_calibrated_layer() {
    let m = planted();
    let c = index(&m, "mm_c");
    for mode in [Mode::Minimal, Mode::WorstFirst] {
        let (_, run) = search_planted(mode, Direction::Forward, Precision::Float32);
        assert_eq!(run.result.outcome, Outcome::Found(vec![c]), "{mode:?}");
    }
    for mode in [Mode::Bisect, Mode::Linear] {
        let (_, run) = search_planted(mode, Direction::Reverse, Precision::Float32);
        assert_eq!(run.result.outcome, Outcome::Found(vec![c]), "{mode:?}");
        // Forward, the first N up to it: all three.
        let (_, run) = search_planted(mode, Direction::Forward, Precision::Float32);
        let all = vec![index(&m, "mm_a"), index(&m, "mm_b"), c];
        assert_eq!(run.result.outcome, Outcome::Found(all), "{mode:?}");
    }
}

#[test]
fn jobs_evaluate_candidates_together_with_the_same_trials() {
    let phases = |r: &QdqRun| -> Vec<(Vec<usize>, bool)> {
        r.result
            .trials
            .iter()
            .map(|t| (t.marked.clone(), t.passed))
            .collect()
    };
    for (mode, direction) in [
        (Mode::Minimal, Direction::Forward),
        (Mode::Bisect, Direction::Forward),
        (Mode::Linear, Direction::Reverse),
    ] {
        let (_, one) = search_planted(mode, direction, Precision::Float32);
        let (_, three) = search_planted_jobs(mode, direction, Precision::Float32, 3);
        assert_eq!(three.result.outcome, one.result.outcome, "{mode:?}");
        assert_eq!(phases(&three), phases(&one), "{mode:?}");
        assert_eq!(
            three.stats.evaluations + three.stats.speculative_evaluations,
            three.result.trials.len() + three.result.speculative
        );
    }
}

#[test]
fn the_answer_is_the_stripped_model_and_ranks_the_planted_layer_first() {
    let (m, run) = search_planted(Mode::Minimal, Direction::Forward, Precision::Float32);
    let c = index(&m, "mm_c");
    assert_eq!(run.space.ranking(Objective::Layers)[0], c);
    let answer = run.answer.unwrap();
    // mm_c reads the float hb; the other pairs stay.
    let g = &answer.model.graph;
    assert_eq!(g.nodes[index(&answer.model, "mm_c")].inputs[0], "hb");
    assert!(g.nodes.iter().any(|n| n.name == "ha_q"));
    assert!(!g.nodes.iter().any(|n| n.name == "hb_q"));
    let lines = exclusion_lines(&m, &[c]);
    assert!(lines[0].ends_with("--nodes_to_exclude mm_c"), "{lines:?}");
    assert!(
        lines[1].contains("nodes_to_exclude=[\"mm_c\"]"),
        "{lines:?}"
    );
    assert!(unnamed_in_file(&m, &[c]).is_empty());
    // FLOPs come from the shapes: a [2, 4] x [4, 4] MatMul is 2·2·4·4.
    assert_eq!(run.space.flops[index(&m, "mm_a")], 64);
}

#[test]
fn float16_marks_pass_too() {
    let (m, run) = search_planted(Mode::Minimal, Direction::Forward, Precision::Float16);
    assert_eq!(run.result.outcome, Outcome::Found(vec![index(&m, "mm_c")]));
    let a = run.answer.unwrap();
    let g = &a.model.graph;
    let mm = &g.nodes[index(&a.model, "mm_c")];
    assert_eq!(
        g.initializers[&mm.inputs[1]].dtype(),
        crate::tensor::DType::F16
    );
}

/// Under a fusion model every run derives its regions for the shapes of the inputs it runs
/// on (TensorRT's optimization profile): a model whose declared dimensions are unknown still
/// runs its float16 Q/DQ addition as one region.
#[test]
fn runs_derive_their_regions_from_the_shapes_of_their_inputs() {
    use crate::exec::qdq::float16_tests::{codes, residual_add};
    let (mut g, feeds, want) = residual_add();
    for v in &mut g.inputs {
        v.shape = Some(vec![
            crate::graph::Dim::Unknown,
            crate::graph::Dim::Fixed(want.len()),
        ]);
    }
    let interp = Interpreter::new(&g).unwrap();
    let fused = run_with(&interp, &feeds, FusionModel::TensorRt, true).unwrap();
    assert_eq!(codes(&fused, "sq"), want);
    let plain = run_with(&interp, &feeds, FusionModel::None, true).unwrap();
    assert_ne!(codes(&plain, "sq"), want);
}

/// The answer says why: the layer's quantized activation, its step, the clipped share and the
/// rounding error, and what the criterion said without it.
#[test]
fn answered_layers_come_with_their_quantization_error() {
    let (m, run) = search_planted(Mode::Minimal, Direction::Forward, Precision::Float32);
    assert_eq!(run.reasons.len(), 1);
    let r = &run.reasons[0];
    assert_eq!((r.layer.as_str(), r.output.as_str()), ("mm_c", "y"));
    assert!(r.required_atol > 0.05, "{r:?}");
    assert_eq!(r.inputs.len(), 1, "{r:?}");
    let i = &r.inputs[0];
    assert_eq!(i.tensor, "hb");
    assert_eq!(i.scale, 0.5);
    assert_eq!(i.clipped, Some(0.0));
    assert!(i.relative_error > 0.05, "{i:?}");
    assert!(r.cause().starts_with("rounding of 'hb'"), "{}", r.cause());
    assert!(
        r.alone.as_deref().is_some_and(|a| a.starts_with("fails")),
        "{r:?}"
    );
    // A range far too small saturates most values instead.
    let (_, run) = search_model(
        planted_with(1e-4),
        Mode::Minimal,
        Direction::Forward,
        Precision::Float32,
        1,
    );
    assert_eq!(run.result.outcome, Outcome::Found(vec![index(&m, "mm_c")]));
    let r = &run.reasons[0];
    assert!(r.inputs[0].clipped.is_some_and(|c| c > 0.5), "{r:?}");
    assert!(r.cause().starts_with("saturation"), "{}", r.cause());
}

/// x → Q/DQ → MatMul (a Q/DQ layer), then dynamic quantization: DynamicQuantizeLinear →
/// MatMulInteger → Cast → Mul (operator-style: computes on codes, no pair to remove). With
/// `qdq` false only the dynamic part.
fn mixed_styles(qdq: bool) -> Model {
    use crate::onnx::testing::with_int;
    let mut nodes = Vec::new();
    let mut src = "x";
    if qdq {
        nodes.push(node("QuantizeLinear", "x_q", &["x", "s", "z8"], &["xq"]));
        nodes.push(node(
            "DequantizeLinear",
            "x_dq",
            &["xq", "s", "z8"],
            &["xd"],
        ));
        nodes.push(node("DequantizeLinear", "w_dq", &["wq", "ws"], &["wd"]));
        nodes.push(node("MatMul", "mm", &["xd", "wd"], &["h"]));
        src = "h";
    }
    nodes.push(node(
        "DynamicQuantizeLinear",
        "dyn",
        &[src],
        &["hq", "hs", "hz"],
    ));
    nodes.push(node("MatMulInteger", "mmi", &["hq", "w2", "hz"], &["acc"]));
    nodes.push(with_int(node("Cast", "cast", &["acc"], &["accf"]), "to", 1));
    nodes.push(node("Mul", "mul", &["accf", "hs"], &["y"]));
    let w = |n: usize| i8s(&[4, n], (0..4 * n).map(|i| (i as i8 % 5) * 3 - 6).collect());
    model(
        nodes,
        vec![
            ("s", Tensor::scalar_f32(0.05)),
            ("z8", i8s(&[], vec![0])),
            ("ws", Tensor::scalar_f32(0.1)),
            ("wq", w(4)),
            ("w2", w(3)),
        ],
        &["y"],
    )
}

/// Runs a minimal Q/DQ search on `m` (default criterion, no golden outputs).
fn search_with_events(m: &Model) -> (Result<QdqRun>, Vec<String>) {
    let (run, hooks) = run_search(
        m,
        Criterion::default(),
        Mode::Minimal,
        Direction::Forward,
        Precision::Float32,
        1,
    );
    (run, hooks.events)
}

#[test]
fn operator_style_quantization_is_named_a_warning_when_mixed_and_an_error_alone() {
    let (run, events) = search_with_events(&mixed_styles(true));
    assert_eq!(
        run.unwrap().space.candidates.len(),
        1,
        "the Q/DQ MatMul only"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("mixes quantization styles")
                && e.contains("'dyn' (DynamicQuantizeLinear)")
                && e.contains("'mmi' (MatMulInteger)")
                && e.contains("--golden")),
        "{events:?}"
    );
    let (run, _) = search_with_events(&mixed_styles(false));
    let e = run.err().expect("no Q/DQ layer").to_string();
    assert!(
        e.contains("operator-style") && e.contains("'mmi' (MatMulInteger)"),
        "{e}"
    );
}
