use super::*;
use crate::graph::testing::{graph, node};
use crate::graph::{Attribute, ValueInfo};
use crate::Interpreter;

fn value(name: &str, dtype: DType, dims: &[Option<usize>]) -> ValueInfo {
    ValueInfo {
        name: name.into(),
        dtype: Some(dtype),
        shape: Some(
            dims.iter()
                .enumerate()
                .map(|(i, d)| match d {
                    Some(n) => Dim::Fixed(*n),
                    None => Dim::Param(format!("d{i}")),
                })
                .collect(),
        ),
    }
}

fn with(mut n: crate::Node, attrs: &[(&str, Attribute)]) -> crate::Node {
    for (k, v) in attrs {
        n.attrs.insert(k.to_string(), v.clone());
    }
    n
}

const VOCAB: usize = 5;

/// A decoder with GenAI's names whose next token depends on the whole context through its
/// one-layer KV cache and on the mask's length: embedding e = E[ids]; the cache keeps every
/// position's e; logits = (e + Σ cache) · W + (Σ mask) · u.
fn tiny_decoder() -> Graph {
    let (b, s, t, p) = (None, None, None, None);
    let ints = |v: &[i64]| Tensor::from_i64(vec![v.len()], v.to_vec());
    graph(
        vec![
            node("embed", "Gather", &["E", "input_ids"], &["e"]),
            node("k", "Unsqueeze", &["e", "one"], &["k"]),
            with(
                node(
                    "cat_k",
                    "Concat",
                    &["past_key_values.0.key", "k"],
                    &["present.0.key"],
                ),
                &[("axis", Attribute::Int(2))],
            ),
            with(
                node(
                    "cat_v",
                    "Concat",
                    &["past_key_values.0.value", "k"],
                    &["present.0.value"],
                ),
                &[("axis", Attribute::Int(2))],
            ),
            node("ctx", "ReduceSum", &["present.0.key", "two"], &["ctx"]),
            node("ctx2", "Squeeze", &["ctx", "one"], &["ctx2"]),
            node("h", "Add", &["e", "ctx2"], &["h"]),
            node("mm", "MatMul", &["h", "W"], &["mm"]),
            with(
                node("maskf", "Cast", &["attention_mask"], &["maskf"]),
                &[("to", Attribute::Int(1))],
            ),
            node("msum", "ReduceSum", &["maskf", "one"], &["msum"]),
            node("m3", "Unsqueeze", &["msum", "two"], &["m3"]),
            node("mu", "Mul", &["m3", "u"], &["mu"]),
            node("logits", "Add", &["mm", "mu"], &["logits"]),
        ],
        vec![
            value("input_ids", DType::I64, &[b, s]),
            value("attention_mask", DType::I64, &[b, t]),
            value(
                "past_key_values.0.key",
                DType::F32,
                &[b, Some(1), p, Some(2)],
            ),
            value(
                "past_key_values.0.value",
                DType::F32,
                &[b, Some(1), p, Some(2)],
            ),
        ],
        vec![
            value("logits", DType::F32, &[b, s, Some(VOCAB)]),
            value("present.0.key", DType::F32, &[b, Some(1), t, Some(2)]),
            value("present.0.value", DType::F32, &[b, Some(1), t, Some(2)]),
        ],
        vec![
            (
                "E",
                Tensor::from_f32(
                    vec![VOCAB, 2],
                    vec![0.3, -1.0, 1.2, 0.4, -0.7, 0.9, 0.1, 0.1, -1.1, -0.6],
                ),
            ),
            (
                "W",
                Tensor::from_f32(
                    vec![2, VOCAB],
                    vec![1.0, -0.5, 0.2, 0.8, -1.3, 0.4, 1.1, -0.9, -0.2, 0.6],
                ),
            ),
            (
                "u",
                Tensor::from_f32(vec![VOCAB], vec![0.0, 0.05, -0.07, 0.11, 0.02]),
            ),
            ("one", ints(&[1])),
            ("two", ints(&[2])),
        ],
    )
}

fn prompt(rows: &[&[i64]]) -> Feeds {
    let mut f = Feeds::new();
    let len = rows[0].len();
    f.insert(
        "input_ids".into(),
        Tensor::from_i64(vec![rows.len(), len], rows.concat()),
    );
    f
}

fn run_with<'a>(
    interp: &'a Interpreter<'a>,
) -> impl FnMut(usize, &Feeds) -> Result<Vec<(String, Tensor)>> + 'a {
    |_, f| Ok(interp.run(f)?.outputs)
}

/// Greedy generation without the cache: the whole sequence again at every step (an empty
/// past), its last position's logits.
fn uncached(
    interp: &Interpreter,
    d: &Decoder,
    rows: &[&[i64]],
    steps: usize,
) -> (Vec<i64>, Vec<f32>) {
    let mut seqs: Vec<Vec<i64>> = rows.iter().map(|r| r.to_vec()).collect();
    let mut tokens = vec![Vec::new(); rows.len()];
    let mut logits = vec![Vec::new(); rows.len()];
    for _ in 0..steps {
        let refs: Vec<&[i64]> = seqs.iter().map(Vec::as_slice).collect();
        let first = d.first_feeds(&prompt(&refs)).unwrap();
        let out = interp.run(&first).unwrap();
        let l = out.output("logits").unwrap();
        let (rows_last, vocab) = last_positions(l, seqs.len()).unwrap();
        for (b, row) in rows_last.chunks(vocab).enumerate() {
            let t = argmax(row) as i64;
            tokens[b].push(t);
            logits[b].extend_from_slice(row);
            seqs[b].push(t);
        }
    }
    (tokens.concat(), logits.concat())
}

#[test]
fn a_generation_through_the_cache_equals_rerunning_the_whole_sequence() {
    let g = tiny_decoder();
    let interp = Interpreter::new(&g).unwrap();
    let d = Decoder::new(&g, 6).unwrap();
    let rows: [&[i64]; 2] = [&[1, 3, 0], &[4, 4, 2]];
    let first = d.first_feeds(&prompt(&rows)).unwrap();
    assert_eq!(first["attention_mask"].as_i64().unwrap(), &[1; 6]);
    assert_eq!(first["past_key_values.0.key"].shape(), &[2, 1, 0, 2]);
    let out = d.generate(first, &mut run_with(&interp)).unwrap();
    assert_eq!(out[0].0, TOKENS);
    assert_eq!(out[0].1.shape(), &[2, 6]);
    assert_eq!(out[1].0, LOGITS);
    assert_eq!(out[1].1.shape(), &[2, 6, VOCAB]);
    let (tokens, logits) = uncached(&interp, &d, &rows, 6);
    assert_eq!(out[0].1.as_i64().unwrap(), tokens.as_slice());
    assert_eq!(out[1].1.as_f32().unwrap(), logits.as_slice());
    // The test means something: the generated ids are not one id repeated.
    let distinct: std::collections::BTreeSet<i64> = tokens.iter().copied().collect();
    assert!(distinct.len() > 1, "{tokens:?}");
}

#[test]
fn the_logits_of_each_step_come_back_apart() {
    let g = tiny_decoder();
    let interp = Interpreter::new(&g).unwrap();
    let d = Decoder::new(&g, 3).unwrap();
    let rows: [&[i64]; 2] = [&[1, 3], &[4, 2]];
    let out = d
        .generate(
            d.first_feeds(&prompt(&rows)).unwrap(),
            &mut run_with(&interp),
        )
        .unwrap();
    let steps = logit_steps(&out[1].1).unwrap();
    assert_eq!(steps.len(), 3);
    let all = out[1].1.as_f32().unwrap();
    for (s, t) in steps.iter().enumerate() {
        assert_eq!(t.shape(), &[2, VOCAB]);
        let v = t.as_f32().unwrap();
        assert_eq!(&v[..VOCAB], &all[s * VOCAB..(s + 1) * VOCAB]);
        assert_eq!(&v[VOCAB..], &all[(3 + s) * VOCAB..(4 + s) * VOCAB]);
    }
}

#[test]
fn a_prompt_keeps_its_own_mask_and_positions_count_its_ones() {
    let mut g = tiny_decoder();
    g.inputs
        .push(value("position_ids", DType::I64, &[None, None]));
    let d = Decoder::new(&g, 1).unwrap();
    let mut f = prompt(&[&[1, 2, 3]]);
    f.insert(
        "attention_mask".into(),
        Tensor::from_i64(vec![1, 3], vec![0, 1, 1]),
    );
    // A past in the set is replaced by the empty cache.
    f.insert(
        "past_key_values.0.key".into(),
        Tensor::zeros(DType::F32, vec![1, 1, 4, 2]),
    );
    let first = d.first_feeds(&f).unwrap();
    assert_eq!(first["attention_mask"].as_i64().unwrap(), &[0, 1, 1]);
    assert_eq!(first["position_ids"].as_i64().unwrap(), &[1, 0, 1]);
    assert_eq!(first["past_key_values.0.key"].shape(), &[1, 1, 0, 2]);
    // A mask of another shape than the prompt's is not the prompt's: all ones.
    f.insert(
        "attention_mask".into(),
        Tensor::from_i64(vec![1, 2], vec![0, 1]),
    );
    let first = d.first_feeds(&f).unwrap();
    assert_eq!(first["attention_mask"].as_i64().unwrap(), &[1, 1, 1]);
    assert_eq!(first["position_ids"].as_i64().unwrap(), &[0, 1, 2]);
}

#[test]
fn models_and_prompts_without_genai_names_get_errors_naming_what_is_missing() {
    let g = tiny_decoder();
    let err = |g: &Graph, steps| Decoder::new(g, steps).unwrap_err().to_string();
    assert!(err(&g, 0).contains("at least 1"));
    let mut no_ids = g.clone();
    no_ids.inputs[0].name = "ids".into();
    assert!(
        err(&no_ids, 2).contains("no input 'input_ids'"),
        "{}",
        err(&no_ids, 2)
    );
    let mut no_logits = g.clone();
    no_logits.outputs[0].name = "scores".into();
    assert!(err(&no_logits, 2).contains("no output 'logits'"));
    let mut no_present = g.clone();
    no_present.outputs.truncate(2);
    assert!(err(&no_present, 2).contains("'present.0.value'"));
    let mut dynamic_heads = g.clone();
    dynamic_heads.inputs[2] = value(
        "past_key_values.0.key",
        DType::F32,
        &[None, None, None, Some(2)],
    );
    assert!(err(&dynamic_heads, 2).contains("kv_heads and head_size fixed"));
    let mut no_cache = g.clone();
    no_cache.inputs.truncate(2);
    no_cache.outputs.truncate(1);
    assert!(err(&no_cache, 2).contains("no KV cache"));
    let d = Decoder::new(&g, 2).unwrap();
    let e = d.first_feeds(&Feeds::new()).unwrap_err().to_string();
    assert!(
        e.contains("no 'input_ids'") && e.contains("--load-inputs"),
        "{e}"
    );
    let e = d
        .first_feeds(&{
            let mut f = Feeds::new();
            f.insert("input_ids".into(), Tensor::from_i64(vec![3], vec![1, 2, 3]));
            f
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("[batch, length]"), "{e}");
}

#[test]
fn the_last_positions_are_each_rows_last_logits_whatever_their_float_type() {
    // [batch 2, length 3, vocab 4]: value = 100·b + 10·position + class.
    let v: Vec<f32> = (0..2)
        .flat_map(|b| (0..3).flat_map(move |p| (0..4).map(move |c| (100 * b + 10 * p + c) as f32)))
        .collect();
    let want = vec![20.0, 21.0, 22.0, 23.0, 120.0, 121.0, 122.0, 123.0];
    let l = Tensor::from_f32(vec![2, 3, 4], v.clone());
    assert_eq!(last_positions(&l, 2).unwrap(), (want.clone(), 4));
    let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
    let l = Tensor::new(vec![2, 3, 4], crate::tensor::TensorData::F16(h.into())).unwrap();
    assert_eq!(last_positions(&l, 2).unwrap(), (want, 4));
    let l = Tensor::from_f32(vec![2, 3, 4], v);
    assert!(
        last_positions(&l, 1).is_err(),
        "batch 2 against a prompt of 1"
    );
}

#[test]
fn argmax_is_numpys() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[1.0, f32::NAN, 5.0, f32::NAN]), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
}

#[test]
fn only_a_criterion_that_names_the_logits_judges_them() {
    use crate::compare::Metric;
    let mut c = Criterion::default();
    assert!(!judges_logits(&c));
    c.metrics.push(Metric::parse("tokens:0.9").unwrap());
    assert!(!judges_logits(&c));
    c.metrics.push(Metric::parse("kl:0.01").unwrap());
    assert!(judges_logits(&c));
    let mut c = Criterion::default();
    c.atol.per_output.insert(LOGITS.into(), 0.05);
    assert!(judges_logits(&c));
}

#[test]
fn a_verdict_on_generations_judges_tokens_and_names_the_step_of_logits() {
    use crate::compare::{Criterion, Metric};
    use crate::search::builtin::Verdict;
    let gen = |ids: &[i64], l: &[f32]| {
        vec![
            (
                TOKENS.to_string(),
                Tensor::from_i64(vec![1, 2], ids.to_vec()),
            ),
            (
                LOGITS.to_string(),
                Tensor::from_f32(vec![1, 2, 2], l.to_vec()),
            ),
        ]
    };
    let golden = gen(&[1, 0], &[0.0, 1.0, 1.0, 0.0]);
    let near = gen(&[1, 0], &[0.0, 1.0, 0.9, 0.0]);
    let judge = |out: &[(String, Tensor)], c: &Criterion| {
        let mut v = Verdict::decoded();
        v.add(out, &golden, c).unwrap();
        v.finish()
    };
    // Equal tokens pass the default criterion; the logits' error is measured, not judged.
    let e = judge(&near, &Criterion::default());
    assert!(e.passed, "{}", e.summary);
    assert!((e.error - 0.1).abs() < 1e-6, "{}", e.error);
    assert!(
        e.summary.contains("'logits' step 1 (not judged)"),
        "{}",
        e.summary
    );
    // Named, they are judged step by step.
    let mut strict = Criterion::default();
    strict.atol.per_output.insert(LOGITS.into(), 0.05);
    let e = judge(&near, &strict);
    assert!(
        !e.passed && e.summary.contains("'logits' step 1 elemwise error"),
        "{}",
        e.summary
    );
    // A different token fails the default criterion; tokens:0.5 lets one of two differ.
    let other = gen(&[1, 3], &[0.0, 1.0, 1.0, 0.0]);
    let e = judge(&other, &Criterion::default());
    assert!(
        !e.passed && e.summary.contains("'tokens' 1 of 2 equal"),
        "{}",
        e.summary
    );
    let mut half = Criterion::default();
    half.metrics.push(Metric::parse("tokens:0.5").unwrap());
    assert!(judge(&other, &half).passed);
    half.metrics[0] = Metric::parse("tokens:0.75").unwrap();
    let e = judge(&other, &half);
    assert!(
        !e.passed && e.summary.contains("Token Agreement: 0.5"),
        "{}",
        e.summary
    );
}

/// [`tiny_decoder`] with h scaled up by 2^k and back down before the logits (`mul_big`,
/// `mul_small`): exact in float16 until h·2^k passes 65504. Its embedding's first column is
/// positive, so the cache's sum, and |h|, grow with every token.
fn overflowing_decoder(k: i32) -> Graph {
    let mut g = tiny_decoder();
    let at = g.nodes.iter().position(|n| n.name == "mm").unwrap();
    g.nodes[at].inputs[0] = "hs".into();
    g.nodes
        .insert(at, node("mul_small", "Mul", &["hb", "small"], &["hs"]));
    g.nodes
        .insert(at, node("mul_big", "Mul", &["h", "big"], &["hb"]));
    let scale = |x: f32| Tensor::from_f32(vec![1], vec![x]);
    g.initializers.insert("big".into(), scale(2f32.powi(k)));
    g.initializers.insert("small".into(), scale(2f32.powi(-k)));
    // Multiples of 1/8 (float16 computes these sums exactly), first column positive.
    g.initializers.insert(
        "E".into(),
        Tensor::from_f32(
            vec![VOCAB, 2],
            vec![0.5, -1.0, 1.25, 0.375, 0.75, 0.875, 1.0, 0.125, 0.625, -0.5],
        ),
    );
    g.initializers.insert(
        "W".into(),
        Tensor::from_f32(
            vec![2, VOCAB],
            vec![
                1.0, -0.5, 0.25, 0.75, -1.25, 0.375, 1.125, -0.875, -0.25, 0.625,
            ],
        ),
    );
    g.initializers.insert(
        "u".into(),
        Tensor::from_f32(vec![VOCAB], vec![0.0, 0.125, -0.25, 0.375, 0.0]),
    );
    g
}

/// The largest |h| of the prompt step and of the whole generation, in float32.
fn h_range(g: &Graph, rows: &[&[i64]], steps: usize) -> (f32, f32) {
    let interp = Interpreter::new(g).unwrap();
    let d = Decoder::new(g, steps).unwrap();
    let keep = crate::RunOptions {
        keep_intermediates: true,
    };
    let mut max = Vec::new();
    d.generate(d.first_feeds(&prompt(rows)).unwrap(), &mut |_, f| {
        let r = interp.run_with(f, &keep)?;
        let h = r.intermediates["h"].as_f32().unwrap();
        max.push(h.iter().fold(0f32, |m, x| m.max(x.abs())));
        Ok(r.outputs)
    })
    .unwrap();
    (max[0], max.iter().copied().fold(0f32, f32::max))
}

/// A float16 search judged on generations needs the layers whose overflow only later tokens
/// reach; judged on the prompt step alone, it needs none.
#[test]
fn a_search_judged_on_generations_finds_an_overflow_the_prompt_step_misses() {
    use crate::compare::Criterion;
    use crate::precision::{plan::PrecisionPlan, Accumulator, Precision};
    use crate::search::driver::{run_search, SearchHooks, SearchJob};
    use crate::search::plans::{PlanSpace, PlanSpaceConfig};
    use crate::search::space::Found;
    use crate::search::{Direction, Grouping, Mode, Objective, Outcome, Ranking, SearchOptions};
    use std::sync::atomic::AtomicBool;

    struct Quiet;
    impl SearchHooks for Quiet {
        fn event(&mut self, _: crate::event::Event) {}
        fn log(&mut self, _: String) {}
    }
    const STEPS: usize = 6;
    let rows: [&[i64]; 1] = [&[0, 3]];
    // 2^k with 65504 / 2^k between the prompt step's largest |h| and the generation's.
    let (first, all) = h_range(&overflowing_decoder(0), &rows, STEPS);
    let k = (1..15)
        .find(|&k| {
            let limit = 65504.0 / 2f32.powi(k);
            first < limit && limit < all
        })
        .unwrap_or_else(|| panic!("no power of two between |h| {first} and {all}"));
    let g = overflowing_decoder(k);
    let interp = Interpreter::new(&g).unwrap();
    let d = Decoder::new(&g, STEPS).unwrap();
    let search = |decode: Option<&Decoder>| {
        // The prompt step's feeds either way.
        let feeds = vec![d.first_feeds(&prompt(&rows)).unwrap()];
        let stop = AtomicBool::new(false);
        let mut space = PlanSpace::new(PlanSpaceConfig {
            interp: &interp,
            feeds: &feeds,
            criterion: Criterion::default(),
            user: None,
            low: PrecisionPlan::uniform(&g, Precision::Float16),
            high: Precision::Float32,
            accumulate: Accumulator::F32,
            amax: None,
            cache_budget: Some(1 << 20),
            jobs: 1,
            stop: &stop,
            decode,
        })
        .unwrap();
        let job = SearchJob {
            graph: &g,
            golden: None,
            options: SearchOptions {
                mode: Mode::Minimal,
                direction: Direction::Forward,
                objective: Objective::Layers,
                ranking: Ranking::Sensitivity,
                jobs: 1,
                group: Grouping::None,
            },
            check: None,
            remote: None,
            replay: None,
            layer_errors: false,
            stop: &stop,
        };
        let run = run_search(&mut space, job, &mut Quiet).unwrap();
        assert!(matches!(run.found, Found::Plans { .. }));
        match run.result.outcome {
            Outcome::Found(m) => m.iter().map(|&i| g.nodes[i].name.clone()).collect(),
            Outcome::NothingNeeded => Vec::new(),
            o => panic!("{o:?}"),
        }
    };
    // The prompt step alone: the logits are exact in float16 (tolerance 1e-5 passes).
    assert_eq!(search(None), Vec::<String>::new());
    assert_eq!(search(Some(&d)), vec!["mul_big", "mul_small"]);
}
