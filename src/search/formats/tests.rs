use super::cost::{CostModel, Target};
use super::*;
use crate::onnx::testing::{load, model_proto, node};
use crate::tensor::Tensor;

const K: usize = 16;

fn w(seed: usize) -> Tensor {
    Tensor::from_f32(
        vec![K, K],
        (0..K * K)
            .map(|i| ((i * 7 + seed) % 13) as f32 / 13.0 - 0.5)
            .collect(),
    )
}

/// x → MatMul a → MatMul b → Relu → MatMul c → y, and q/k/v MatMuls reading b's Relu... no:
/// x → a → r(Relu) ; r → q, k, v (one input) ; q + k → s(Add) ; s + v → y.
fn model() -> crate::onnx::Model {
    load(model_proto(
        vec![
            node("MatMul", "a", &["x", "wa"], &["ya"]),
            node("Relu", "r", &["ya"], &["yr"]),
            node("MatMul", "q", &["yr", "wq"], &["yq"]),
            node("MatMul", "k", &["yr", "wk"], &["yk"]),
            node("MatMul", "v", &["yr", "wv"], &["yv"]),
            node("Add", "s", &["yq", "yk"], &["ys"]),
            node("Add", "t", &["ys", "yv"], &["y"]),
        ],
        vec![("wa", w(1)), ("wq", w(2)), ("wk", w(3)), ("wv", w(4))],
        &[("x", &[1, K as i64])],
        &[("y", &[1, K as i64])],
        17,
    ))
}

fn space<'g>(graph: &'g Graph, formats: &[Precision]) -> FormatSpace<'g> {
    let candidates = PrecisionPlan::candidates(graph);
    let groups = decision_groups(graph, &candidates);
    let elements: HashMap<String, u64> = graph
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().chain(&n.outputs))
        .map(|v| (v.clone(), K as u64))
        .collect();
    let flops: HashMap<usize, u64> = (0..graph.nodes.len())
        .map(|i| (i, 2 * (K * K) as u64))
        .collect();
    let costs = CostModel {
        layers: cost_layers(graph, &candidates, &elements, &flops),
        target: Target::builtin("h100").unwrap(),
    };
    FormatSpace::new(
        graph,
        groups,
        formats,
        Precision::Float32,
        costs,
        CostObjective::Latency,
    )
}

fn names(graph: &Graph, g: &DecisionGroup) -> Vec<String> {
    g.layers
        .iter()
        .map(|&i| graph.nodes[i].name.clone())
        .collect()
}

#[test]
fn epilogues_and_gemms_reading_one_input_share_a_decision() {
    let m = model();
    let g = &m.graph;
    let groups = decision_groups(g, &PrecisionPlan::candidates(g));
    let named: Vec<Vec<String>> = groups.iter().map(|x| names(g, x)).collect();
    assert_eq!(
        named,
        vec![
            vec!["a".to_string(), "r".into()],
            vec!["q".into(), "k".into(), "v".into()],
            vec!["s".into()],
            vec!["t".into()],
        ]
    );
    assert!(groups[0].quantizable && groups[1].quantizable && !groups[2].quantizable);
}

#[test]
fn int8_groups_run_their_epilogue_in_the_high_precision() {
    let m = model();
    let s = space(&m.graph, &[Precision::Int8, Precision::Float16]);
    // Quantizable groups may take int8 (cheapest) or float16; Adds only float16.
    assert_eq!(
        s.orders[0],
        vec![Precision::Int8, Precision::Float16, Precision::Float32]
    );
    assert_eq!(s.orders[2], vec![Precision::Float16, Precision::Float32]);
    let layers = s.layer_precisions(&[
        Precision::Int8,
        Precision::Float16,
        Precision::Float16,
        Precision::Float32,
    ]);
    assert_eq!(&layers[..2], &[Precision::Int8, Precision::Float32]);
    assert_eq!(&layers[2..5], &[Precision::Float16; 3]);
    assert_eq!(s.uniform(Precision::Int8)[2], Precision::Float32);
}

/// Fails when layer `overflows` is float16 or bfloat16, when `clips` is fp8, and when both
/// layers of `interact` are int8 at once (either alone passes); error: the failures counted.
struct Planted<'g> {
    graph: &'g Graph,
    overflows: &'static str,
    clips: &'static str,
    interact: Option<(&'static str, &'static str)>,
    judged: usize,
}

impl Planted<'_> {
    fn precision(&self, plan: &PrecisionPlan, name: &str) -> Precision {
        let i = self
            .graph
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap();
        plan.layers[i]
    }

    fn verdict(&self, plan: &PrecisionPlan) -> Evaluation {
        let mut failures = 0;
        if matches!(
            self.precision(plan, self.overflows),
            Precision::Float16 | Precision::BFloat16
        ) {
            failures += 1;
        }
        if self.precision(plan, self.clips).is_scaled()
            && self.precision(plan, self.clips) != Precision::Int8
        {
            failures += 1;
        }
        if let Some((a, b)) = self.interact {
            if self.precision(plan, a) == Precision::Int8
                && self.precision(plan, b) == Precision::Int8
            {
                failures += 1;
            }
        }
        Evaluation {
            passed: failures == 0,
            error: failures as f64,
            summary: format!("{failures} failure(s)"),
        }
    }
}

impl PlanJudge for Planted<'_> {
    fn judge(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        self.judged += plans.len();
        plans.iter().map(|p| Ok(self.verdict(p))).collect()
    }

    fn verify(&mut self, plan: &PrecisionPlan) -> Result<Evaluation> {
        Ok(self.verdict(plan))
    }
}

/// The walk on to the safest point (`--full-front`).
fn walk(s: &FormatSpace<'_>, judge: &mut dyn PlanJudge, jobs: usize) -> FrontWalk {
    walk_until(s, judge, jobs, true)
}

fn walk_until(
    s: &FormatSpace<'_>,
    judge: &mut dyn PlanJudge,
    jobs: usize,
    full: bool,
) -> FrontWalk {
    let options = WalkOptions { jobs, full };
    walk_front(s, judge, options, &AtomicBool::new(false), &mut |_| {}).unwrap()
}

/// The walk's own points (the uniform baselines left out).
fn walked(front: &FrontWalk) -> Vec<&FrontPoint> {
    front
        .points
        .iter()
        .filter(|p| !matches!(p.step, Step::Uniform { .. }))
        .collect()
}

#[test]
fn the_walk_chooses_the_cheapest_passing_assignment() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let mut judge = Planted {
        graph: g,
        overflows: "a",
        clips: "q",
        interact: None,
        judged: 0,
    };
    let front = walk(&s, &mut judge, 1);
    let chosen = &front.points[front.chosen.unwrap()];
    // a overflows float16 but quantizes; q's group is clipped by fp8 but not by int8.
    assert!(chosen.formats[0].is_scaled(), "{:?}", chosen.formats);
    assert_eq!(chosen.formats[1], Precision::Int8);
    // The cheapest passing assignment of all (36 here), found by trying every one: the Adds
    // stay float32, as float16 ones would pay for Casts of the int8 layers' float32 outputs.
    let mut best: Option<(f64, Vec<Precision>)> = None;
    let mut all: Vec<Vec<Precision>> = vec![vec![]];
    for o in &s.orders {
        all = all
            .into_iter()
            .flat_map(|a| o.iter().map(move |&f| [a.clone(), vec![f]].concat()))
            .collect();
    }
    for a in all {
        let c = s.cost(&a).latency_us;
        if judge.verdict(&s.plan(&a)).passed && best.as_ref().is_none_or(|(b, _)| c < *b) {
            best = Some((c, a));
        }
    }
    let (best_cost, best) = best.unwrap();
    assert_eq!(chosen.cost.latency_us, best_cost, "best: {best:?}");
    assert_eq!(&chosen.formats[2..], &[Precision::Float32; 2]);
    assert!(chosen.passed && front.verified.as_ref().unwrap().passed);
    // Every point was evaluated: the uniform baselines, then the walk from the cheapest to
    // the safest.
    assert_eq!(front.baselines, vec![0, 1, 2]);
    for (&k, f) in front.baselines.iter().zip(&s.formats) {
        assert_eq!(front.points[k].step, Step::Uniform { format: *f });
        assert_eq!(front.points[k].formats, s.uniform(*f));
    }
    let walk = walked(&front);
    assert_eq!(walk[0].step, Step::Start);
    assert!(!walk[0].passed);
    assert_eq!(
        walk.iter()
            .rfind(|p| !matches!(p.step, Step::Lower { .. }))
            .unwrap()
            .formats,
        vec![Precision::Float32; 4]
    );
    let sensitivity_runs: usize = s.orders.iter().map(|o| o.len() - 1).sum();
    assert_eq!(front.evaluations, sensitivity_runs + front.points.len() + 1);
    assert_eq!(judge.judged, sensitivity_runs + front.points.len());
    // Nothing cheaper passed: every point before the chosen one failed or cost more.
    let best = chosen.cost.latency_us;
    assert!(front
        .points
        .iter()
        .all(|p| !p.passed || p.cost.latency_us >= best));
    assert!(
        front.log.iter().all(|l| l.starts_with("Descent")),
        "{:?}",
        front.log
    );
}

#[test]
fn a_predicted_point_that_fails_is_repaired_and_said() {
    let m = model();
    let g = &m.graph;
    let s = space(g, &[Precision::Int8, Precision::Float16]);
    // a and q/k/v each pass alone in int8, together they fail.
    let mut judge = Planted {
        graph: g,
        overflows: "s",
        clips: "t",
        interact: Some(("a", "q")),
        judged: 0,
    };
    let front = walk(&s, &mut judge, 1);
    let repairs: Vec<&String> = front
        .log
        .iter()
        .filter(|l| !l.starts_with("Descent"))
        .collect();
    assert_eq!(repairs.len(), 1, "{:?}", front.log);
    assert!(repairs[0].starts_with("Repair: point"), "{}", repairs[0]);
    let repair = front
        .points
        .iter()
        .position(|p| matches!(p.step, Step::Repair { .. }))
        .unwrap();
    assert!(front.points[repair - 1].predicted_pass && !front.points[repair - 1].passed);
    let chosen = &front.points[front.chosen.unwrap()];
    assert!(chosen.passed);
    // One of the two interacting groups left int8; s stays out of float16.
    assert!(chosen.formats[0] != Precision::Int8 || chosen.formats[1] != Precision::Int8);
    assert_eq!(chosen.formats[2], Precision::Float32);
}

#[test]
fn the_answer_is_the_same_for_any_number_of_jobs() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let planted = |g| Planted {
        graph: g,
        overflows: "a",
        clips: "k",
        interact: Some(("a", "q")),
        judged: 0,
    };
    let one = walk(&s, &mut planted(g), 1);
    let four = walk(&s, &mut planted(g), 4);
    let formats = |f: &FrontWalk| {
        f.points
            .iter()
            .map(|p| p.formats.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(formats(&one), formats(&four));
    assert_eq!(one.chosen, four.chosen);
}

#[test]
fn the_walk_stops_once_no_later_point_can_be_chosen() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let planted = |g| Planted {
        graph: g,
        overflows: "a",
        clips: "q",
        interact: None,
        judged: 0,
    };
    let full = walk(&s, &mut planted(g), 1);
    let mut judge = planted(g);
    let short = walk_until(&s, &mut judge, 1, false);
    let formats = |f: &FrontWalk| {
        f.points
            .iter()
            .map(|p| p.formats.clone())
            .collect::<Vec<_>>()
    };
    // The same answer from a prefix of the full walk, fewer evaluations.
    let (cf, cs) = (full.chosen.unwrap(), short.chosen.unwrap());
    assert_eq!(full.points[cf].formats, short.points[cs].formats);
    let upto = |f: &FrontWalk| {
        f.points
            .iter()
            .take_while(|p| !matches!(p.step, Step::Lower { .. }))
            .count()
    };
    let n = upto(&short);
    assert!(n < upto(&full));
    assert_eq!(formats(&short)[..n], formats(&full)[..n]);
    assert!(short.evaluations < full.evaluations);
    assert_eq!(judge.judged + 1, short.evaluations);
    assert!(
        short
            .log
            .iter()
            .any(|l| l.starts_with("The walk stopped at cost")),
        "{:?}",
        short.log
    );
    // The full walk's points after the short one's last cost at least the chosen point.
    let best = short.points[cs].cost.latency_us;
    assert!(full.points[n..upto(&full)]
        .iter()
        .all(|p| p.cost.latency_us >= best));
}

/// A judge by a rule over the precisions of layers a, q, s and t (one per group): the
/// rule gives the verdict and the error.
struct Rule<'g> {
    graph: &'g Graph,
    rule: fn([Precision; 4]) -> (bool, usize),
}

impl Rule<'_> {
    fn verdict(&self, plan: &PrecisionPlan) -> Evaluation {
        let of = |name: &str| {
            let i = self
                .graph
                .nodes
                .iter()
                .position(|n| n.name == name)
                .unwrap();
            plan.layers[i]
        };
        let (passed, error) = (self.rule)(["a", "q", "s", "t"].map(of));
        Evaluation {
            passed,
            error: error as f64,
            summary: format!("error {error}"),
        }
    }
}

impl PlanJudge for Rule<'_> {
    fn judge(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        plans.iter().map(|p| Ok(self.verdict(p))).collect()
    }

    fn verify(&mut self, plan: &PrecisionPlan) -> Result<Evaluation> {
        Ok(self.verdict(plan))
    }
}

fn low(p: Precision) -> usize {
    usize::from(p != Precision::Float32)
}

/// Passes when a, q, s and t are all float16, or when at most one of them is not float32;
/// error: how many are not float32. Each format passes alone, so the walk repairs from the
/// cheapest point, raising one group at a time to float32: it never crosses all-float16.
fn all_or_nothing(g: &Graph) -> Rule<'_> {
    Rule {
        graph: g,
        rule: |layers| {
            let count: usize = layers.iter().map(|&p| low(p)).sum();
            let all16 = layers.iter().all(|&p| p == Precision::Float16);
            (all16 || count <= 1, count)
        },
    }
}

/// Passes when q, s and t are float16 whatever a is, or when at most one of a, q, s, t is
/// not float32; error: a counts 1, q 3, s and t 1 each when not float32.
fn lowerable_a(g: &Graph) -> Rule<'_> {
    Rule {
        graph: g,
        rule: |[a, q, s, t]| {
            let count = low(a) + low(q) + low(s) + low(t);
            let rest16 = [q, s, t].iter().all(|&p| p == Precision::Float16);
            (rest16 || count <= 1, low(a) + 3 * low(q) + low(s) + low(t))
        },
    }
}

#[test]
fn a_uniform_baseline_off_the_walk_is_chosen_when_it_is_the_cheapest_that_passed() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let fp16 = front_baseline(&s, Precision::Float16);
    for full in [true, false] {
        let front = walk_until(&s, &mut all_or_nothing(g), 1, full);
        let chosen = front.chosen.unwrap();
        assert_eq!(chosen, front.baselines[fp16], "full {full}");
        assert_eq!(
            front.points[chosen].step,
            Step::Uniform {
                format: Precision::Float16
            }
        );
        assert!(front.verified.as_ref().unwrap().passed);
        // The walk did not cross it, and what the walk passed costs more.
        let walk = walked(&front);
        assert!(walk
            .iter()
            .all(|p| p.formats != s.uniform(Precision::Float16)));
        let best = front.points[chosen].cost.latency_us;
        assert!(walk.iter().all(|p| !p.passed || p.cost.latency_us > best));
        if full {
            assert!(walk.iter().any(|p| p.passed));
        } else {
            let stopped = format!("point {chosen} passed");
            assert!(
                front.log.iter().any(|l| l.contains(&stopped)),
                "{:?}",
                front.log
            );
        }
    }
}

/// The descent from the all-float16 point of `judge`'s space (fp8, int8, fp16), `jobs`
/// evaluations at a time: the front (that point first) and the log.
fn descend_from_fp16(
    s: &FormatSpace<'_>,
    judge: &mut Rule<'_>,
    jobs: usize,
) -> (Vec<FrontPoint>, Vec<String>, usize) {
    let sensitivity: Vec<Vec<Sensitivity>> = (0..s.groups.len())
        .map(|k| {
            s.orders[k][..s.orders[k].len() - 1]
                .iter()
                .map(|&f| {
                    let mut formats = vec![Precision::Float32; s.groups.len()];
                    formats[k] = f;
                    let e = judge.verdict(&s.plan(&formats));
                    Sensitivity {
                        format: f,
                        error: e.error,
                        passed: e.passed,
                    }
                })
                .collect()
        })
        .collect();
    let fp16 = s.uniform(Precision::Float16);
    let e = judge.verdict(&s.plan(&fp16));
    assert!(e.passed);
    let mut points = vec![FrontPoint {
        formats: fp16.clone(),
        cost: s.cost(&fp16),
        passed: true,
        error: e.error,
        summary: e.summary,
        predicted_pass: true,
        step: Step::Uniform {
            format: Precision::Float16,
        },
        check: None,
    }];
    let (mut log, mut evaluations) = (Vec::new(), 0);
    let interrupted = Descent {
        front: Front {
            space: s,
            sensitivity: &sensitivity,
            points: &mut points,
            evaluations: &mut evaluations,
        },
        log: &mut log,
    }
    .run(judge, 0, jobs, &AtomicBool::new(false), &mut |_| {})
    .unwrap();
    assert!(!interrupted);
    (points, log, evaluations)
}

#[test]
fn the_descent_keeps_the_most_sensitive_groups_and_lowers_the_rest() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let (points, log, evaluations) = descend_from_fp16(&s, &mut lowerable_a(g), 1);
    // a (error 1 alone) and q (error 3) can go to fp8; s and t are at their cheapest. The
    // driver's minimal search: both lowered fail, q kept (the most sensitive) passes.
    let steps: Vec<(Step, bool)> = points[1..]
        .iter()
        .map(|p| (p.step.clone(), p.passed))
        .collect();
    let lower = |lowered, phase| Step::Lower {
        from: 0,
        lowered,
        phase,
    };
    assert_eq!(
        steps,
        [
            (lower(2, "check-none"), false),
            (lower(1, "rank-gallop"), true)
        ]
    );
    assert_eq!(evaluations, 2);
    let fp16 = s.uniform(Precision::Float16);
    assert_eq!(points[2].formats[0], Precision::Fp8E4M3);
    assert_eq!(&points[2].formats[1..], &fp16[1..]);
    assert!(points[2].cost.latency_us < points[0].cost.latency_us);
    assert_eq!(
        log.last().unwrap(),
        "Descent: 1 of 2 group(s) lowered pass; 1 keep their format (lowering any one of them too fails): 'q (+2 fused)' (float16)"
    );
}

/// Passes unless a is in fp8 with another group below float32; error as [`lowerable_a`].
fn a_must_stay(g: &Graph) -> Rule<'_> {
    Rule {
        graph: g,
        rule: |[a, q, s, t]| {
            let count = low(a) + low(q) + low(s) + low(t);
            (
                a != Precision::Fp8E4M3 || count <= 1,
                low(a) + 3 * low(q) + low(s) + low(t),
            )
        },
    }
}

#[test]
fn the_descent_lowers_a_sensitive_group_when_a_less_sensitive_one_must_stay() {
    // A prefix of the least sensitive groups (a first) lowers nothing here; the minimal
    // search's pruning finds that q can go while a stays.
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let (points, log, _) = descend_from_fp16(&s, &mut a_must_stay(g), 1);
    let best = points
        .iter()
        .filter(|p| p.passed)
        .min_by(|x, y| x.cost.latency_us.total_cmp(&y.cost.latency_us))
        .unwrap();
    assert_eq!(best.formats[0], Precision::Float16);
    assert_eq!(best.formats[1], Precision::Fp8E4M3);
    assert!(matches!(best.step, Step::Lower { lowered: 1, .. }));
    assert!(
        log.last().unwrap().ends_with(
            "keep their format (lowering any one of them too fails): 'a (+1 fused)' (float16)"
        ),
        "{log:?}"
    );
    // With evaluations ahead of need the front is the same: the strategy's trials only.
    for jobs in [2, 3] {
        let (more, more_log, _) = descend_from_fp16(&s, &mut a_must_stay(g), jobs);
        let key = |p: &[FrontPoint]| {
            p.iter()
                .map(|p| (p.formats.clone(), p.step.clone(), p.passed))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&more), key(&points), "jobs {jobs}");
        assert_eq!(more_log, log);
    }
}

/// The position of format `f`'s baseline among the space's formats.
fn front_baseline(s: &FormatSpace<'_>, f: Precision) -> usize {
    s.formats.iter().position(|&x| x == f).unwrap()
}

/// A stand-in `--check` command: passes a point when `passes` says so; records what it
/// judged, batch by batch.
fn checked(
    s: &FormatSpace<'_>,
    front: &mut FrontWalk,
    jobs: usize,
    passes: impl Fn(&FrontPoint) -> bool,
) -> Vec<Vec<usize>> {
    let mut batches = Vec::new();
    let points = front.points.clone();
    check_front(
        s,
        front,
        jobs,
        &AtomicBool::new(false),
        &mut |ks: &[usize]| {
            batches.push(ks.to_vec());
            ks.iter()
                .map(|&k| {
                    Ok(Evaluation {
                        passed: passes(&points[k]),
                        error: f64::NAN,
                        summary: format!("point {k}"),
                    })
                })
                .collect()
        },
    )
    .unwrap();
    batches
}

#[test]
fn a_check_judges_the_chosen_point_and_its_neighbours_and_decides() {
    let m = model();
    let g = &m.graph;
    let s = space(
        g,
        &[Precision::Fp8E4M3, Precision::Int8, Precision::Float16],
    );
    let planted = |g| Planted {
        graph: g,
        overflows: "a",
        clips: "q",
        interact: None,
        judged: 0,
    };
    let emulated = walk(&s, &mut planted(g), 1);
    let chosen = emulated.chosen.unwrap();
    let cost = |f: &FrontWalk, k: usize| f.points[k].cost.latency_us;
    let mut by_cost: Vec<usize> = (0..emulated.points.len()).collect();
    by_cost.sort_by(|&a, &b| {
        cost(&emulated, a)
            .total_cmp(&cost(&emulated, b))
            .then(a.cmp(&b))
    });
    let at = by_cost.iter().position(|&k| k == chosen).unwrap();
    // The command agrees with the emulation: the chosen point and both neighbours judged
    // (two at a time), the choice stays.
    let mut front = emulated.clone();
    let batches = checked(&s, &mut front, 2, |p| p.passed);
    let mut want = vec![chosen];
    want.extend(at.checked_sub(1).map(|p| by_cost[p]));
    want.push(by_cost[at + 1]);
    assert_eq!(batches.concat(), want);
    assert!(batches.iter().all(|b| b.len() <= 2));
    assert_eq!(front.chosen, Some(chosen));
    assert!(front.log.last().unwrap().contains("stays chosen"));
    assert_eq!(front.evaluations, emulated.evaluations + want.len());
    // The command fails the emulation's choice (and what the emulation failed): the next
    // points it passes by cost are judged until one passes; the cheapest is chosen.
    let mut front = emulated.clone();
    let refused = emulated.points[chosen].formats.clone();
    let agrees = |p: &FrontPoint| p.passed && p.formats != refused;
    checked(&s, &mut front, 1, agrees);
    let now = front.chosen.unwrap();
    assert!(agrees(&front.points[now]));
    assert!(front.points[chosen]
        .check
        .as_ref()
        .is_some_and(|c| !c.passed));
    let cheapest_agreeing = (0..front.points.len())
        .filter(|&k| agrees(&front.points[k]))
        .min_by(|&a, &b| cost(&front, a).total_cmp(&cost(&front, b)).then(a.cmp(&b)));
    assert_eq!(Some(now), cheapest_agreeing, "{:?}", front.log);
    assert!(front.log.last().unwrap().contains("chosen instead"));
    // The command passes nothing: every point the emulation passed is judged, none chosen.
    let mut front = emulated.clone();
    checked(&s, &mut front, 3, |_| false);
    assert_eq!(front.chosen, None);
    assert!(front.points.iter().all(|p| !p.passed || p.check.is_some()));
    assert!(front.log.last().unwrap().contains("passed none"));
}

#[test]
fn a_check_that_cannot_judge_a_point_ends_with_its_own_error() {
    let m = model();
    let g = &m.graph;
    let s = space(g, &[Precision::Int8, Precision::Float16]);
    let planted = Planted {
        graph: g,
        overflows: "s",
        clips: "t",
        interact: None,
        judged: 0,
    };
    let mut planted = planted;
    let mut front = walk(&s, &mut planted, 1);
    // The first point of a batch of two could not be exported: its error, not a count.
    let e = check_front(
        &s,
        &mut front,
        2,
        &AtomicBool::new(false),
        &mut |_: &[usize]| vec![Err(Error::Invalid("point 3: cannot export".into()))],
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot export"), "{e}");
    // A command that answers for fewer points than asked is an error too.
    let e = check_front(
        &s,
        &mut front,
        2,
        &AtomicBool::new(false),
        &mut |_: &[usize]| Vec::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("--check: 0 verdict(s) for"), "{e}");
}
