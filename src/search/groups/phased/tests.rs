use super::*;
use crate::search::testing::Planted;
use crate::search::{Direction, Objective};

/// `blocks` blocks of `per_block` roles (layer `b * per_block + r`), then two layers of their
/// own; the roles as the grouping gives them.
fn blocks(blocks: usize, per_block: usize) -> (SearchSpace, Vec<Vec<usize>>) {
    let n = blocks * per_block + 2;
    let mut groups: Vec<Vec<usize>> = (0..per_block)
        .map(|r| (0..blocks).map(|b| b * per_block + r).collect())
        .collect();
    groups.push(vec![n - 2]);
    groups.push(vec![n - 1]);
    let space = SearchSpace {
        candidates: (0..n).collect(),
        flops: (0..n).map(|i| 10 + i as u64).collect(),
        scores: Scores::default(),
        deferred: true,
    };
    (space, groups)
}

fn options(mode: Mode, jobs: usize) -> SearchOptions {
    SearchOptions {
        mode,
        direction: Direction::Forward,
        objective: Objective::Layers,
        ranking: Ranking::Sensitivity,
        jobs,
        group: Grouping::Roles,
    }
}

fn by_roles(
    space: &SearchSpace,
    groups: &[Vec<usize>],
    opts: &SearchOptions,
    oracle: &mut Planted,
    stop: &AtomicBool,
) -> (SearchResult, Vec<Trial>) {
    let mut seen = Vec::new();
    let r = search_by_roles(
        space,
        opts,
        groups,
        oracle,
        &mut |t| seen.push(t.clone()),
        stop,
    )
    .unwrap();
    (r, seen)
}

/// The plain minimal search over `space` with `needed` planted, and the oracle's calls (its
/// sensitivity ranking's one run per layer included).
fn plain_minimal(space: &SearchSpace, needed: &[usize]) -> (SearchResult, usize) {
    let mut oracle = Planted::new(needed, &space.candidates);
    let r = search(
        space,
        &SearchOptions {
            group: Grouping::None,
            ..options(Mode::Minimal, 1)
        },
        &mut oracle,
        &mut |_| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    (r, oracle.calls)
}

/// Trials in layer terms, numbered in order, each set once; the answer one of the passing.
fn check_trials(space: &SearchSpace, r: &SearchResult, seen: &[Trial]) {
    assert_eq!(seen.len(), r.trials.len());
    let mut sets = HashSet::new();
    for (k, t) in r.trials.iter().enumerate() {
        assert_eq!(t.iteration, k + 1);
        assert_eq!(seen[k].marked, t.marked);
        assert!(t.marked.windows(2).all(|w| w[0] < w[1]));
        assert!(t.marked.iter().all(|l| space.candidates.contains(l)));
        assert_eq!(t.marked_flops, space.flops_of(&t.marked));
        assert!(sets.insert(t.marked.clone()), "{:?} twice", t.marked);
    }
    if let Outcome::Found(m) | Outcome::Interrupted(Some(m)) = &r.outcome {
        assert!(
            r.trial_of(m).is_some_and(|t| t.passed),
            "{m:?} never passed"
        );
    }
}

/// `--mode minimal --group roles` over `space` with `needed` planted: the answer is `needed`,
/// the trials are well formed ([`check_trials`]) and every evaluation is a trial (none made
/// twice). Returns the result and the oracle's calls.
fn minimal_by_roles(
    space: &SearchSpace,
    groups: &[Vec<usize>],
    needed: &[usize],
    what: &str,
) -> (SearchResult, usize) {
    let mut oracle = Planted::new(needed, &space.candidates);
    let (r, seen) = by_roles(
        space,
        groups,
        &options(Mode::Minimal, 1),
        &mut oracle,
        &AtomicBool::new(false),
    );
    assert_eq!(r.outcome, Outcome::Found(needed.to_vec()), "{what}");
    check_trials(space, &r, &seen);
    assert_eq!(oracle.calls, r.trials.len(), "{what}");
    (r, oracle.calls)
}

#[test]
fn minimal_by_roles_finds_the_planted_layers_in_fewer_evaluations() {
    // 30 blocks of 6 roles: roles 1 and 2 needed in blocks 27–29, and a layer of its own.
    let (space, groups) = blocks(30, 6);
    let mut needed: Vec<usize> = [27, 28, 29]
        .iter()
        .flat_map(|b| [b * 6 + 1, b * 6 + 2])
        .collect();
    needed.push(181);
    needed.sort_unstable();
    // Every evaluation is a trial (none made twice), the role ranking's included.
    let (r, calls) = minimal_by_roles(&space, &groups, &needed, "27–29");
    assert_eq!(
        r.trials.iter().filter(|t| t.phase == "rank-roles").count(),
        groups.len()
    );
    assert_eq!(r.contiguous_count, None);
    assert_eq!(r.speculative, 0);
    // A role of one layer that failed alone is a layer that failed alone.
    assert_eq!(r.failing_alone, vec![181]);

    // The plain search: one ranking run per layer, then its own evaluations.
    let (plain, plain_calls) = plain_minimal(&space, &needed);
    assert_eq!(plain.outcome, r.outcome);
    assert!(
        calls * 2 < plain_calls,
        "by roles {} evaluations, plain {plain_calls}",
        calls,
    );
}

#[test]
fn every_mode_answers_a_passing_set_by_roles() {
    let (space, groups) = blocks(8, 3);
    let needed = vec![4, 13, 25];
    for mode in [Mode::Bisect, Mode::Linear, Mode::WorstFirst, Mode::Minimal] {
        let stop = AtomicBool::new(false);
        let mut oracle = Planted::new(&needed, &space.candidates);
        let (r, seen) = by_roles(&space, &groups, &options(mode, 1), &mut oracle, &stop);
        check_trials(&space, &r, &seen);
        let Outcome::Found(m) = &r.outcome else {
            panic!("{mode:?}: {:?}", r.outcome);
        };
        assert!(needed.iter().all(|n| m.contains(n)), "{mode:?}: {m:?}");
        if mode == Mode::Minimal {
            assert_eq!(m, &needed);
        }
    }
}

#[test]
fn jobs_change_neither_the_answer_nor_the_trials() {
    let (space, groups) = blocks(12, 4);
    let needed = vec![5, 9, 41, 49];
    let run = |jobs: usize| {
        let stop = AtomicBool::new(false);
        let mut oracle = Planted::new(&needed, &space.candidates);
        oracle.parallel = true;
        let (r, seen) = by_roles(
            &space,
            &groups,
            &options(Mode::Minimal, jobs),
            &mut oracle,
            &stop,
        );
        check_trials(&space, &r, &seen);
        r
    };
    let one = run(1);
    let four = run(4);
    assert_eq!(one.outcome, Outcome::Found(needed.clone()));
    assert_eq!(four.outcome, one.outcome);
    let sets = |r: &SearchResult| -> Vec<(Vec<usize>, &'static str)> {
        r.trials
            .iter()
            .map(|t| (t.marked.clone(), t.phase))
            .collect()
    };
    assert_eq!(sets(&four), sets(&one));
    assert!(four.speculative > 0);
}

#[test]
fn the_ends_and_an_interruption_keep_their_meaning() {
    let (space, groups) = blocks(5, 2);
    let stop = AtomicBool::new(false);
    // Nothing needed; the reference failing (a layer that is not a candidate is needed).
    for (needed, want) in [
        (vec![], Outcome::NothingNeeded),
        (vec![999], Outcome::ReferenceFails),
    ] {
        let mut oracle = Planted::new(&needed, &space.candidates);
        let (r, _) = by_roles(
            &space,
            &groups,
            &options(Mode::Minimal, 1),
            &mut oracle,
            &stop,
        );
        assert_eq!(r.outcome, want);
    }
    // Stopped during the refinement: the best passing set so far, in layers.
    static STOP: AtomicBool = AtomicBool::new(false);
    let needed = vec![1, 3, 11];
    let mut oracle = Planted::new(&needed, &space.candidates);
    oracle.stop_after = Some((12, &STOP));
    let (r, seen) = by_roles(
        &space,
        &groups,
        &options(Mode::Minimal, 1),
        &mut oracle,
        &STOP,
    );
    check_trials(&space, &r, &seen);
    let Outcome::Interrupted(Some(best)) = &r.outcome else {
        panic!("{:?}", r.outcome);
    };
    assert!(needed.iter().all(|n| best.contains(n)), "{best:?}");
}

#[test]
fn growth_scores_rank_roles_by_their_worst_layer() {
    let layers = Scores {
        by_layer: HashMap::from([(0, 1.0), (1, 5.0), (2, f64::NAN), (3, 2.0)]),
        failing_alone: vec![3],
    };
    let groups = vec![vec![0, 1], vec![2], vec![3]];
    let roles = role_scores(&layers, &groups);
    assert_eq!(roles.by_layer.get(&0), Some(&5.0));
    assert_eq!(roles.by_layer.get(&1), None);
    assert_eq!(roles.by_layer.get(&2), Some(&2.0));
    assert_eq!(roles.failing_alone, vec![2]);
}

/// `blocks` blocks of x → scale (×w) → unscale (×1/w) → Add 0.25 → Relu → ×1 with x ≈ 70:
/// where w = 1024 (the blocks in `overflowing`) the product passes float16's 65504, so both
/// multiplications of that block must stay in float32; elsewhere w = 8. Every other value is
/// exact in float16 (multiples of 1/16 below 128), so only the overflow matters.
fn repeated_blocks(blocks: usize, overflowing: &[usize]) -> crate::graph::Graph {
    use crate::graph::testing::{graph, node, vi};
    use crate::tensor::Tensor;
    let mut nodes = Vec::new();
    let mut inits: Vec<(String, Tensor)> = Vec::new();
    let mut prev = "x".to_string();
    for b in 0..blocks {
        let w = if overflowing.contains(&b) {
            1024.0
        } else {
            8.0
        };
        let v = |s: &str| format!("{s}{b}");
        let out = if b + 1 == blocks {
            "y".to_string()
        } else {
            v("h")
        };
        let p = format!("/model/layers.{b}");
        nodes.push(node(
            &format!("{p}/scale/Mul"),
            "Mul",
            &[&prev, &v("w")],
            &[&v("s")],
        ));
        nodes.push(node(
            &format!("{p}/unscale/Mul"),
            "Mul",
            &[&v("s"), &v("iw")],
            &[&v("u")],
        ));
        nodes.push(node(
            &format!("{p}/residual/Add"),
            "Add",
            &[&v("u"), "quarter"],
            &[&v("a")],
        ));
        nodes.push(node(
            &format!("{p}/act/Relu"),
            "Relu",
            &[&v("a")],
            &[&v("r")],
        ));
        nodes.push(node(
            &format!("{p}/norm/Mul"),
            "Mul",
            &[&v("r"), "one"],
            &[&out],
        ));
        inits.push((v("w"), Tensor::from_f32(vec![1], vec![w])));
        inits.push((v("iw"), Tensor::from_f32(vec![1], vec![1.0 / w])));
        prev = out;
    }
    inits.push(("quarter".into(), Tensor::from_f32(vec![1], vec![0.25])));
    inits.push(("one".into(), Tensor::from_f32(vec![1], vec![1.0])));
    let inits: Vec<(&str, Tensor)> = inits.iter().map(|(k, t)| (k.as_str(), t.clone())).collect();
    graph(nodes, vec![vi("x", &[4])], vec![vi("y", &[4])], inits)
}

/// The emulated search of `g` under float16 (minimal, sensitivity ranking) by `group`.
fn emulated_search(g: &crate::graph::Graph, group: Grouping) -> crate::search::driver::SearchRun {
    use crate::search::driver::{run_search, SearchHooks, SearchJob};
    struct Quiet;
    impl SearchHooks for Quiet {
        fn event(&mut self, _: crate::event::Event) {}
        fn log(&mut self, _: String) {}
    }
    let interp = crate::exec::Interpreter::new(g).unwrap();
    let mut feeds = crate::tensor::Feeds::new();
    feeds.insert(
        "x".into(),
        crate::tensor::Tensor::from_f32(vec![4], vec![70.0, 70.5, 71.0, 72.0]),
    );
    let feeds = vec![feeds];
    let stop = AtomicBool::new(false);
    let mut space = crate::search::plans::PlanSpace::new(crate::search::plans::PlanSpaceConfig {
        interp: &interp,
        feeds: &feeds,
        criterion: crate::compare::Criterion {
            atol: crate::compare::PerOutput::new(0.1),
            rtol: crate::compare::PerOutput::new(0.01),
            ..Default::default()
        },
        user: None,
        low: crate::precision::plan::PrecisionPlan::uniform(
            g,
            crate::precision::Precision::Float16,
        ),
        high: crate::precision::Precision::Float32,
        accumulate: crate::numeric::Accumulator::F32,
        amax: None,
        cache_budget: Some(1 << 20),
        jobs: 1,
        stop: &stop,
        decode: None,
    })
    .unwrap();
    let job = SearchJob {
        graph: g,
        golden: None,
        options: SearchOptions {
            group,
            ..options(Mode::Minimal, 1)
        },
        check: None,
        remote: None,
        replay: None,
        layer_errors: false,
        stop: &stop,
    };
    run_search(&mut space, job, &mut Quiet).unwrap()
}

#[test]
fn an_emulated_repeated_block_model_gets_the_plain_answer_in_fewer_runs() {
    let overflowing = [7, 19, 26];
    let g = repeated_blocks(30, &overflowing);
    let plain = emulated_search(&g, Grouping::None);
    let grouped = emulated_search(&g, Grouping::Roles);
    let want: Vec<usize> = overflowing
        .iter()
        .flat_map(|b| [b * 5, b * 5 + 1])
        .collect();
    assert_eq!(plain.result.outcome, Outcome::Found(want.clone()));
    // The same answer, and it passed (every answer by roles is a set that was evaluated).
    assert_eq!(grouped.result.outcome, plain.result.outcome);
    assert!(grouped.result.trial_of(&want).is_some_and(|t| t.passed));
    assert!(matches!(
        grouped.found,
        crate::search::space::Found::Plans {
            answer: Some(_),
            ..
        }
    ));
    // The plain search ranks each of the 150 layers, then evaluates; by roles, the 5 roles'
    // ranking runs are evaluations of their own and no layer is ranked.
    let plain_runs = plain.stats.evaluations + plain.stats.ranking_runs;
    let grouped_runs = grouped.stats.evaluations + grouped.stats.ranking_runs;
    assert_eq!(grouped.stats.ranking_runs, 0);
    assert!(
        grouped_runs * 2 < plain_runs,
        "30 blocks × 5 roles: plain {} evaluations + {} ranking runs = {plain_runs}; by roles {} evaluations + {} ranking runs = {grouped_runs}",
        plain.stats.evaluations,
        plain.stats.ranking_runs,
        grouped.stats.evaluations,
        grouped.stats.ranking_runs
    );
    // The answer reads as two rules.
    let rules = super::super::answer_rules(&g, &plain.space.candidates, &want);
    let lines: Vec<String> = rules.iter().map(super::super::Rule::describe).collect();
    assert_eq!(
        lines,
        [
            "scale/Mul in /model/layers 7, 19, 26",
            "unscale/Mul in /model/layers 7, 19, 26"
        ]
    );
}

/// Needed layers on 30 blocks × 6 roles (layer `b * 6 + r`; 180 is the seventh role's only
/// layer, 181 the eighth's), as LLM answers look: a role needed late, in every block,
/// scattered, or only in the first block.
fn shapes_of_answers() -> Vec<(&'static str, Vec<usize>)> {
    let in_blocks = |roles: &[usize], blocks: &mut dyn Iterator<Item = usize>| -> Vec<usize> {
        blocks
            .flat_map(|b| roles.iter().map(move |r| b * 6 + r).collect::<Vec<_>>())
            .collect()
    };
    let mut shapes = vec![
        (
            "roles 1, 2 in blocks 27–29, and 181",
            [in_blocks(&[1, 2], &mut (27..30)), vec![181]].concat(),
        ),
        (
            "roles 1, 2 in blocks 2–29, and 181",
            [in_blocks(&[1, 2], &mut (2..30)), vec![181]].concat(),
        ),
        (
            "roles 1–4 in every block, and 181",
            [in_blocks(&[1, 2, 3, 4], &mut (0..30)), vec![181]].concat(),
        ),
        (
            "role 1 in blocks 7, 19, 26",
            in_blocks(&[1], &mut [7, 19, 26].into_iter()),
        ),
        (
            "role 1 in blocks 2–29, role 3 in 10–29, role 5 in block 0",
            [
                in_blocks(&[1], &mut (2..30)),
                in_blocks(&[3], &mut (10..30)),
                vec![5],
            ]
            .concat(),
        ),
        (
            "roles 1, 2 in blocks 2–29, role 4 in blocks 2–10 and 24–29",
            [
                in_blocks(&[1, 2], &mut (2..30)),
                in_blocks(&[4], &mut (2..11).chain(24..30)),
            ]
            .concat(),
        ),
    ];
    for (_, n) in &mut shapes {
        n.sort_unstable();
    }
    shapes
}

#[test]
fn a_run_of_blocks_inside_a_role_goes_before_the_single_layer_tests() {
    // SmolLM2's post-attention norms: needed in the early and the late blocks, not between,
    // in a role pruned after two others needed in every block from 2. Found before pruning,
    // the hole leaves the last confirmation nothing to test again: every set it judges was
    // judged while pruning.
    let (space, groups) = blocks(30, 6);
    let (shape, needed) = shapes_of_answers().swap_remove(5);
    let (r, calls) = minimal_by_roles(&space, &groups, &needed, shape);
    let in_phase = |p: &str| r.trials.iter().filter(|t| t.phase == p).count();
    assert_eq!(in_phase("confirm"), 0, "{shape}: {} evaluations", calls);
    // The hole's 13 blocks go in a few evaluations (halving, then widening), not 13.
    assert!(in_phase("refine-holes") <= 3 * 7 + 12, "{shape}");
    assert!(
        r.trials
            .iter()
            .any(|t| t.phase == "refine-holes" && t.passed),
        "{shape}"
    );
}

#[test]
fn the_refinement_costs_about_one_evaluation_per_layer_of_the_answer() {
    // 1-minimality alone takes one failing evaluation per layer of the answer (without it);
    // beyond that, phase 1 (8 role rankings, its own strategy), the trims and the drops cost
    // a few dozen evaluations, not one per layer of every needed role twice over.
    let (space, groups) = blocks(30, 6);
    for (shape, needed) in shapes_of_answers() {
        let (r, calls) = minimal_by_roles(&space, &groups, &needed, shape);
        let (plain, plain_calls) = plain_minimal(&space, &needed);
        assert_eq!(plain.outcome, r.outcome, "{shape}");
        assert!(
            calls <= needed.len() + 50 && calls < plain_calls,
            "{shape}: {} layers needed; by roles {} evaluations, plain {plain_calls} (182 of them ranking)",
            needed.len(),
            calls,
        );
    }
}

#[test]
fn an_interruption_anywhere_keeps_a_passing_set_that_holds_the_answer() {
    let (space, groups) = blocks(30, 6);
    let (_, needed) = shapes_of_answers().swap_remove(4);
    let mut total = Planted::new(&needed, &space.candidates);
    let stop = AtomicBool::new(false);
    let _ = by_roles(
        &space,
        &groups,
        &options(Mode::Minimal, 1),
        &mut total,
        &stop,
    );
    for n in 1..=total.calls {
        // Leaked: the oracle raises a flag it holds for 'static; a few hundred bytes.
        let flag: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
        let mut oracle = Planted::new(&needed, &space.candidates);
        oracle.stop_after = Some((n, flag));
        let (r, seen) = by_roles(
            &space,
            &groups,
            &options(Mode::Minimal, 1),
            &mut oracle,
            flag,
        );
        check_trials(&space, &r, &seen);
        match &r.outcome {
            Outcome::Interrupted(Some(best)) => assert!(
                needed.iter().all(|l| best.contains(l)),
                "stopped at {n}: {best:?}"
            ),
            // Stopped before any set passed but the reference checks (phase 1's ranking).
            Outcome::Interrupted(None) => {}
            other => panic!("stopped at {n}: {other:?}"),
        }
    }
}
