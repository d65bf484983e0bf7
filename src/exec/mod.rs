//! The interpreter: runs a graph's nodes in topological order on concrete inputs.
//!
//! Values live in slots indexed by their id in the graph's [`ValueIndex`]; a slot is freed
//! after its last reader unless the caller asks to keep every intermediate (layer-wise
//! comparison needs them all).
//!
//! A node with subgraphs (If, Loop, Scan) gets an interpreter per subgraph, prepared once.
//! The values its subgraphs read from enclosing graphs are extra inputs of the node (they
//! live until it has run); its kernel runs the subgraphs through [`SubgraphRunner`], which
//! reads those values by reference, and under a plan runs them in the node's precision.

pub mod cache;
pub mod emulate;
mod epilogue;
pub(crate) mod fusion;
pub(crate) mod qdq;
mod rms;
mod scaled;
mod spin;

pub use cache::{CacheStats, ValueCache};

pub use emulate::{PlanOptions, PreparedPlan};

use crate::error::{Error, Result};
use crate::graph::{Graph, ValueId, ValueIndex};
use crate::ops::{Kernel, OpCtx, OpError, Registry, SubgraphRunner};
use crate::precision::Precision;
use crate::tensor::Tensor;
use emulate::InputPrep;
use std::collections::HashMap;
use std::sync::Arc;

/// The shape of every tensor of an input set, by name: what a plan prepared for these inputs
/// reads its fusion facts from ([`PlanOptions::input_shapes`]).
pub fn feed_shapes(feeds: &Feeds) -> std::collections::BTreeMap<String, Vec<usize>> {
    feeds
        .iter()
        .map(|(k, t)| (k.clone(), t.shape().to_vec()))
        .collect()
}

/// A callback shown every value as it is produced (see [`Interpreter::run_observed`]).
pub type Observer<'a> = &'a mut dyn FnMut(&str, &Tensor);

/// Where the layers of `chain` (its head and stages) were prepared, under `plan` (empty
/// without one): the part of an epilogue's key that tells composed plans apart.
fn chain_origins(
    plan: Option<&PreparedPlan>,
    chain: &epilogue::Chain,
) -> smallvec::SmallVec<[u64; 9]> {
    match plan {
        Some(p) => std::iter::once(chain.head)
            .chain(chain.steps())
            .map(|i| p.origins[i])
            .collect(),
        None => smallvec::SmallVec::new(),
    }
}

/// Runs `f` on a thread of rayon's pool (it is run where it is when already there). The
/// kernels' parallel loops then start from a worker, which shares work through its own queue,
/// instead of handing every loop from an outside thread to the pool and sleeping until it is
/// done — on small models that hand-off was a quarter of the time. The binaries make their
/// main thread worker 0 of the pool ([`crate::threads`]), so that a run starts where it is
/// called. Results do not depend on the thread (kernels are deterministic for any thread
/// count).
fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        spin::with_spinning_workers(f)
    } else {
        rayon::scope(|_| spin::with_spinning_workers(f))
    }
}

/// Checks a tensor against a declared value (defined beside [`crate::graph::ValueInfo`]).
pub use crate::graph::check_against;
/// Inputs by name (defined beside [`Tensor`] so `data` and `onnx` need not depend on `exec`).
pub use crate::tensor::Feeds;

/// What a run should keep besides the graph outputs.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Keep every node output (for `--mark-all`); otherwise values are freed after last use.
    pub keep_intermediates: bool,
}

/// The time one step of a run took ([`Interpreter::run_profiled`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerTime {
    /// The node (index into the nodes of its graph: the main graph's, or the subgraph's that
    /// `scope` names) whose kernel ran.
    pub node: usize,
    /// Where the node is: empty in the main graph, the path of its subgraph in one
    /// (`If_0/then_branch/`, `Loop_0/body/If_1/else_branch/`).
    pub scope: String,
    /// The node's name and op type.
    pub name: String,
    pub op_type: String,
    /// The kernel's wall time, its epilogue included; for a control-flow node, less the
    /// layers of its subgraphs (listed on their own), so the times of a run add up to it.
    pub seconds: f64,
    /// The nodes that ran inside it as its epilogue (their own time is in `seconds`), and
    /// their op types.
    pub fused: Vec<usize>,
    pub fused_ops: Vec<String>,
}

/// Outputs of one run.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Graph outputs in the model's declared order.
    pub outputs: Vec<(String, Tensor)>,
    /// Every node output, when `keep_intermediates` was set.
    pub intermediates: HashMap<String, Tensor>,
}

impl RunResult {
    pub fn output(&self, name: &str) -> Option<&Tensor> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

enum Source<'g> {
    /// A weight (an initializer or folded value of this or an enclosing graph), by name and
    /// resolved once here: a run reads it without a lookup.
    Initializer(String, &'g Tensor),
    /// A value a graph input or an earlier step writes: its slot.
    Slot(ValueId),
    /// A value of an enclosing graph (a subgraph's outer-scope reference), by index in
    /// [`Interpreter::outer_names`].
    Outer(usize),
    Absent,
}

/// A subgraph of a node, prepared.
struct Sub<'g> {
    attr: String,
    interp: Interpreter<'g>,
    /// For each outer name of `interp`: its index among the node's implicit inputs.
    outer: Vec<usize>,
}

struct Step<'g> {
    kernel: Kernel,
    /// Where the op may anchor an epilogue: the shape of the output it would apply it to.
    epilogue_shape: Option<crate::ops::EpilogueShapeFn>,
    opset: i64,
    /// The node's inputs, then its implicit inputs (what its subgraphs read from this scope).
    inputs: Vec<Source<'g>>,
    /// How many of `inputs` are the node's own (the kernel's arguments).
    explicit: usize,
    outputs: Vec<Option<ValueId>>,
    /// Slots whose last reader is this step.
    frees: Vec<ValueId>,
    subs: Vec<Sub<'g>>,
    /// Per explicit input: what the kernel derived from it, where it is a graph initializer
    /// passed as it is ([`crate::ops::prepacked`]).
    prepacked: Vec<crate::ops::prepacked::Prepacked>,
    /// The node only computes folded weights ([`crate::fold`]) and none of them is a graph
    /// output: its readers take the folded values as weights, so a run that shows no
    /// intermediates skips it.
    folded: bool,
    /// The outputs its op keeps in their own type under a 16-bit plan
    /// ([`crate::ops::OpDef::keeps_output_types`]), read here once instead of from the op
    /// registry per layer and run (a string-keyed lookup: ~2 % of an emulated Flan-T5 run).
    kept_outputs: &'static [usize],
}

/// A step's inputs, arguments or outputs: on the stack up to eight (a vector per step and run
/// was a tenth of a small model's run time in malloc and free).
type Args<T> = smallvec::SmallVec<[T; 8]>;

/// What a run holds per value, indexed by [`ValueId`] (a vector as long as the graph's
/// [`ValueIndex`]: its weights' slots stay empty).
struct Slots<T>(Vec<T>);

impl<T: Clone> Slots<T> {
    fn new(values: &ValueIndex, init: T) -> Slots<T> {
        Slots(vec![init; values.len()])
    }
}

impl<T> std::ops::Index<ValueId> for Slots<T> {
    type Output = T;
    fn index(&self, id: ValueId) -> &T {
        &self.0[id.index()]
    }
}

impl<T> std::ops::IndexMut<ValueId> for Slots<T> {
    fn index_mut(&mut self, id: ValueId) -> &mut T {
        &mut self.0[id.index()]
    }
}

/// The steps that read `id` from its slot: its readers in the graph's [`ValueIndex`] that
/// take it as a value (not as a folded weight), in node order, a step once per input.
fn slot_readers<'a>(
    values: &'a ValueIndex,
    steps: &'a [Step],
    id: ValueId,
) -> impl Iterator<Item = usize> + 'a {
    values
        .consumers(id)
        .iter()
        .map(|c| c.node)
        .filter(move |&i| {
            steps[i]
                .inputs
                .iter()
                .any(|s| matches!(s, Source::Slot(x) if *x == id))
        })
}

/// The one step that reads step `i`'s one output, once, where that output is no graph output
/// and `i` has no subgraphs: where a kernel may compute its reader too.
fn sole_reader(values: &ValueIndex, steps: &[Step], i: usize) -> Option<usize> {
    let [Some(out)] = steps[i].outputs.as_slice() else {
        return None;
    };
    if values.is_graph_output(*out) || !steps[i].subs.is_empty() {
        return None;
    }
    let mut readers = slot_readers(values, steps, *out);
    let (first, None) = (readers.next()?, readers.next()) else {
        return None;
    };
    // Read once by that step (Mul(x, x) reads it twice).
    let reads = steps[first]
        .inputs
        .iter()
        .filter(|s| matches!(s, Source::Slot(x) if x == out))
        .count();
    (reads == 1).then_some(first)
}

/// A graph prepared for execution: kernels resolved, value slots and lifetimes computed.
pub struct Interpreter<'g> {
    graph: &'g Graph,
    /// The graph's values: slot `id` holds value `id`.
    values: Arc<ValueIndex>,
    steps: Vec<Step<'g>>,
    input_slots: Vec<ValueId>,
    /// The graph outputs, and whether a slot holds each (else it is a weight or outer value).
    output_slots: Vec<(ValueId, bool)>,
    /// For a subgraph: the values of enclosing graphs it reads, in the order the caller
    /// passes them.
    outer_names: Vec<String>,
    /// Input shapes whose inferred graph shapes were already checked.
    checked_shapes: std::sync::Mutex<std::collections::HashSet<Vec<Vec<usize>>>>,
    /// Per step: the pointwise layers after it that may run as its epilogue.
    chains: Vec<Option<epilogue::Chain>>,
    /// Per step: the Cast and Mul after an integer kernel that it may compute itself.
    scaled: Vec<Option<scaled::ScaledProduct>>,
    /// Per step: the decomposed RMS normalization it starts, which it may compute whole.
    rms: Vec<Option<rms::RmsNorm>>,
    /// The epilogues runs without a plan made (a plan keeps its own).
    epilogues: epilogue::Cache,
}

/// The [`SubgraphRunner`] a control-flow node's kernel gets.
struct ScopeRunner<'r, 'g, 'o, 'p> {
    subs: &'r [Sub<'g>],
    plans: Option<&'r [PreparedPlan]>,
    /// The node's implicit inputs.
    implicit: &'r [Option<&'r Tensor>],
    /// The node's name and, when the run shows subgraph values, its observer (see
    /// [`Interpreter::run_observed`]).
    node: &'r str,
    observer: Option<&'r std::cell::RefCell<Observer<'o>>>,
    /// A profiled run's layer times, which the subgraphs' layers join.
    profile: Option<&'r std::cell::RefCell<Option<&'p mut Vec<LayerTime>>>>,
}

impl SubgraphRunner for ScopeRunner<'_, '_, '_, '_> {
    fn run(&self, attr: &str, inputs: Vec<Tensor>) -> std::result::Result<Vec<Tensor>, OpError> {
        let (k, sub) = self
            .subs
            .iter()
            .enumerate()
            .find(|(_, s)| s.attr == attr)
            .ok_or_else(|| OpError(format!("the node has no subgraph attribute '{attr}'")))?;
        let outer: Vec<Option<&Tensor>> = sub.outer.iter().map(|&i| self.implicit[i]).collect();
        let plan = self.plans.and_then(|p| p.get(k));
        // The subgraph's values are shown by path (`Loop_0/body/x`), every iteration.
        let mut guard = self.observer.map(|o| o.borrow_mut());
        // Formatted only where something shows the names (a loop body runs per iteration).
        let prefix = if self.observer.is_some() || self.profile.is_some() {
            format!("{}/{attr}/", self.node)
        } else {
            String::new()
        };
        let mut nested = |name: &str, t: &Tensor| {
            if let Some(obs) = guard.as_mut() {
                obs(&format!("{prefix}{name}"), t);
            }
        };
        let observer: Option<Observer> = match self.observer {
            Some(_) => Some(&mut nested),
            None => None,
        };
        let mut times = self.profile.map(|p| p.borrow_mut());
        let first = times
            .as_deref()
            .and_then(|t| t.as_deref())
            .map_or(0, Vec::len);
        let r = sub.interp.run_subgraph(
            inputs,
            &outer,
            plan,
            observer,
            times.as_deref_mut().and_then(|t| t.as_deref_mut()),
        );
        // The subgraph's layers (and those of subgraphs inside it) are named by path.
        if let Some(t) = times.as_deref_mut().and_then(|t| t.as_deref_mut()) {
            for lt in &mut t[first..] {
                lt.scope.insert_str(0, &prefix);
            }
        }
        r.map_err(|e| OpError(format!("{attr}: {e}")))
    }
}

impl<'g> Interpreter<'g> {
    /// Resolves every node's kernel; fails naming every op mixprec does not support, subgraph
    /// bodies included.
    pub fn new(graph: &'g Graph) -> Result<Interpreter<'g>> {
        let unsupported = Registry::global().unsupported_in(graph);
        if !unsupported.is_empty() {
            return Err(Error::UnsupportedOps(unsupported));
        }
        Self::new_scoped(graph, Vec::new(), &[])
    }

    /// An interpreter for a subgraph that reads `outer_names` from `enclosing` graphs
    /// (outermost first).
    fn new_scoped(
        graph: &'g Graph,
        outer_names: Vec<String>,
        enclosing: &[&'g Graph],
    ) -> Result<Interpreter<'g>> {
        let registry = Registry::global();
        // An enclosing graph's weight is a weight here too: kernels keep what they derive
        // from it (packed panels) instead of re-deriving it on every run of the subgraph.
        let outer_weights: HashMap<String, &'g Tensor> = outer_names
            .iter()
            .filter_map(|n| Some((n.clone(), crate::graph::enclosing_weight(enclosing, n)?)))
            .collect();
        let scope: Vec<&'g Graph> = enclosing.iter().copied().chain([graph]).collect();
        let values = graph.values();
        // The values held in slots so far: the graph inputs, then each step's outputs.
        let mut written = vec![false; values.len()];
        let input_slots: Vec<ValueId> = values.graph_inputs().to_vec();
        for id in &input_slots {
            written[id.index()] = true;
        }
        let mut steps = Vec::with_capacity(graph.nodes.len());
        for (j, node) in graph.nodes.iter().enumerate() {
            let opset = graph.opset_of(&node.domain);
            // `new` checked the whole model first; this names a subgraph's ops if reached.
            let def = registry
                .def(&node.domain, &node.op_type)
                .ok_or_else(|| Error::UnsupportedOps(registry.unsupported_in(graph)))?;
            crate::ops::attrs::parse_node(node, opset)?;
            let implicit = node.implicit_inputs();
            let mut subs = Vec::new();
            for (attr, g) in node.subgraphs() {
                let names = g.outer_refs();
                let outer = names
                    .iter()
                    .map(|n| {
                        implicit
                            .iter()
                            .position(|i| i == n)
                            .expect("implicit input")
                    })
                    .collect();
                // A node inside a subgraph is named by its path (`If_0/then_branch/Conv_3`).
                let interp = Interpreter::new_scoped(g, names, &scope)
                    .map_err(|e| e.in_subgraph(&node.name, attr))?;
                subs.push(Sub {
                    attr: attr.to_string(),
                    interp,
                    outer,
                });
            }
            let ids = values.node_inputs(j).iter().copied();
            let implicit_ids = values.node_implicit_inputs(j).iter().map(|&id| Some(id));
            let inputs = node
                .inputs
                .iter()
                .chain(&implicit)
                .zip(ids.chain(implicit_ids))
                .map(|(name, id)| {
                    if name.is_empty() {
                        Source::Absent
                    } else if let Some(t) = graph.folded.get(name) {
                        // A folded weight (a Constant's value, a transposed initializer): read
                        // as an initializer, so kernels keep what they derive from it
                        // (packed panels) and epilogues take it as a constant operand.
                        Source::Initializer(name.clone(), t)
                    } else if let Some(id) = id.filter(|id| written[id.index()]) {
                        Source::Slot(id)
                    } else if let Some(t) = graph
                        .initializers
                        .get(name)
                        .or_else(|| outer_weights.get(name).copied())
                    {
                        Source::Initializer(name.clone(), t)
                    } else if let Some(i) = outer_names.iter().position(|o| o == name) {
                        Source::Outer(i)
                    } else {
                        // Topological sort guarantees producers come first.
                        Source::Absent
                    }
                })
                .collect();
            let outputs: Vec<Option<ValueId>> = values.node_outputs(j).to_vec();
            for id in outputs.iter().flatten() {
                written[id.index()] = true;
            }
            steps.push(Step {
                kernel: def.kernel,
                kept_outputs: def.kept_outputs(),
                epilogue_shape: def.epilogue,
                opset,
                inputs,
                explicit: node.inputs.len(),
                outputs,
                frees: Vec::new(),
                subs,
                prepacked: node.inputs.iter().map(|_| Default::default()).collect(),
                folded: graph.is_folded(node)
                    && !values
                        .node_outputs(j)
                        .iter()
                        .flatten()
                        .any(|&id| values.is_graph_output(id)),
            });
        }
        let output_slots: Vec<(ValueId, bool)> = (values.graph_outputs().iter())
            .map(|&id| (id, written[id.index()]))
            .collect();
        // Lifetimes: a slot dies after its last reader, unless it is a graph output.
        for id in values.ids() {
            if !written[id.index()] || values.is_graph_output(id) {
                continue;
            }
            if let Some(i) = slot_readers(&values, &steps, id).last() {
                steps[i].frees.push(id);
            }
        }
        let scaled = scaled::find(graph, &values, &steps);
        let chains = epilogue::find_chains(graph, &values, &steps, &scaled);
        let rms = rms::find(graph, &values, &steps);
        Ok(Interpreter {
            chains,
            scaled,
            rms,
            graph,
            values,
            steps,
            input_slots,
            output_slots,
            outer_names,
            checked_shapes: Default::default(),
            epilogues: Default::default(),
        })
    }

    /// Runs this subgraph with its formal inputs bound to `inputs` and its outer names to
    /// `outer`, under `plan` (the subgraph's own, see [`PreparedPlan`]); returns its outputs.
    fn run_subgraph(
        &self,
        inputs: Vec<Tensor>,
        outer: &[Option<&Tensor>],
        plan: Option<&PreparedPlan>,
        observer: Option<Observer>,
        profile: Option<&mut Vec<LayerTime>>,
    ) -> Result<Vec<Tensor>> {
        if inputs.len() != self.input_slots.len() {
            return Err(Error::Invalid(format!(
                "the subgraph takes {} inputs, it was given {}",
                self.input_slots.len(),
                inputs.len()
            )));
        }
        let inputs = inputs.into_iter().map(Arc::new).collect();
        let nested = observer.is_some();
        let r = self.run_impl(
            inputs,
            outer,
            &RunOptions::default(),
            plan,
            observer,
            None,
            nested,
            None,
            profile,
        )?;
        Ok(r.outputs.into_iter().map(|(_, t)| t).collect())
    }

    /// The feeds as the values of the input slots, after checking them.
    fn feed_values(&self, feeds: &Feeds) -> Result<Vec<Arc<Tensor>>> {
        self.check_feeds(feeds)?;
        self.check_shapes(feeds)?;
        Ok(self
            .input_slots
            .iter()
            .map(|&id| Arc::new(feeds[self.values.name(id)].clone()))
            .collect())
    }

    pub fn graph(&self) -> &Graph {
        self.graph
    }

    /// The layers a plain run executes: every node but those that only compute folded
    /// weights (a run that shows its values, observed or keeping intermediates, runs those
    /// too). PP-OCRv4 rec: 374 of its 860 nodes are such Constants and their arithmetic.
    pub fn layers_per_run(&self) -> u64 {
        self.steps.iter().filter(|s| !s.folded).count() as u64
    }

    /// Runs the graph and returns its outputs.
    pub fn run(&self, feeds: &Feeds) -> Result<RunResult> {
        self.run_with(feeds, &RunOptions::default())
    }

    pub fn run_with(&self, feeds: &Feeds, opts: &RunOptions) -> Result<RunResult> {
        on_pool(|| {
            self.run_impl(
                self.feed_values(feeds)?,
                &[],
                opts,
                None,
                None,
                None,
                false,
                None,
                None,
            )
        })
    }

    /// [`run_cached`](Self::run_cached) showing `observer` every graph input and every value
    /// (executed or taken from the cache) as the run reaches it; values are still freed after
    /// their last use, so memory stays as low as a plain run's.
    pub fn run_cached_observed(
        &self,
        feeds: &Feeds,
        feed_key: u64,
        plan: Option<&PreparedPlan>,
        cache: &mut ValueCache,
        observer: &mut dyn FnMut(&str, &Tensor),
    ) -> Result<RunResult> {
        self.run_cached_observed_to(feeds, feed_key, plan, cache, None, observer)
    }

    /// The most bytes of values a plain run holds at once: graph inputs, and every node
    /// output from its step until its last reader (as [`run`](Self::run) frees them; graph
    /// outputs until the end), with each value's size given by name (0 when unknown). Weights
    /// are not values. What a search's cache budget is measured against.
    pub fn peak_value_bytes(&self, size: &dyn Fn(&str) -> usize) -> usize {
        let of = |s: ValueId| size(self.values.name(s));
        let mut live: usize = self.input_slots.iter().map(|&s| of(s)).sum();
        let mut peak = live;
        for step in &self.steps {
            live += step.outputs.iter().flatten().map(|&s| of(s)).sum::<usize>();
            peak = peak.max(live);
            for &s in &step.frees {
                live = live.saturating_sub(of(s));
            }
        }
        peak
    }

    /// [`run_cached_observed`](Self::run_cached_observed) that stops after node `last` (in
    /// topological order): the observer sees every value up to there, and nothing downstream
    /// is executed. For questions about one layer (why it must stay in high precision), whose
    /// upstream the cache mostly holds.
    pub fn run_cached_until(
        &self,
        feeds: &Feeds,
        feed_key: u64,
        plan: Option<&PreparedPlan>,
        cache: &mut ValueCache,
        last: usize,
        observer: &mut dyn FnMut(&str, &Tensor),
    ) -> Result<()> {
        self.run_cached_observed_to(feeds, feed_key, plan, cache, Some(last), observer)
            .map(|_| ())
    }

    /// The observed cached run of both of the above: to the end, or to `stop_after`.
    fn run_cached_observed_to(
        &self,
        feeds: &Feeds,
        feed_key: u64,
        plan: Option<&PreparedPlan>,
        cache: &mut ValueCache,
        stop_after: Option<usize>,
        observer: &mut dyn FnMut(&str, &Tensor),
    ) -> Result<RunResult> {
        self.run_impl(
            self.feed_values(feeds)?,
            &[],
            &RunOptions::default(),
            plan,
            Some(observer),
            Some((cache, feed_key)),
            false,
            stop_after,
            None,
        )
    }

    /// Runs the graph under `plan` (None: plain FP32), taking every layer whose output
    /// signature is in `cache` from there instead of executing it, and storing what it
    /// executes (see [`cache`]). `feed_key` names the input set: runs on the same inputs must
    /// pass the same key, runs on different inputs different keys. Results are bit-identical to
    /// an uncached run.
    pub fn run_cached(
        &self,
        feeds: &Feeds,
        feed_key: u64,
        opts: &RunOptions,
        plan: Option<&PreparedPlan>,
        cache: &mut ValueCache,
    ) -> Result<RunResult> {
        on_pool(|| {
            self.run_impl(
                self.feed_values(feeds)?,
                &[],
                opts,
                plan,
                None,
                Some((cache, feed_key)),
                false,
                None,
                None,
            )
        })
    }

    /// Runs the graph (under `plan`, if given) as [`run`](Self::run) and
    /// [`run_plan`](Self::run_plan) do, and returns with its outputs the wall time of every
    /// layer it executed, in execution order (a per-layer profile, as ORT's profiler or
    /// trtexec's `--dumpProfile` give it).
    pub fn run_profiled(
        &self,
        feeds: &Feeds,
        plan: Option<&PreparedPlan>,
    ) -> Result<(RunResult, Vec<LayerTime>)> {
        let mut times = Vec::with_capacity(self.steps.len());
        let r = on_pool(|| {
            self.run_impl(
                self.feed_values(feeds)?,
                &[],
                &RunOptions::default(),
                plan,
                None,
                None,
                false,
                None,
                Some(&mut times),
            )
        })?;
        Ok((r, times))
    }

    /// Runs the graph under a prepared precision plan (see [`emulate`]).
    pub fn run_plan(
        &self,
        feeds: &Feeds,
        opts: &RunOptions,
        plan: &PreparedPlan,
    ) -> Result<RunResult> {
        on_pool(|| {
            self.run_impl(
                self.feed_values(feeds)?,
                &[],
                opts,
                Some(plan),
                None,
                None,
                false,
                None,
                None,
            )
        })
    }

    /// Runs the graph and shows `observer` every graph input and every value a node produces,
    /// as it is produced (calibration collects ranges this way without keeping activations).
    /// Values inside If/Loop/Scan bodies are shown too, named by path (`Loop_0/body/x`, as
    /// plans name inner nodes), once per iteration.
    pub fn run_observed(
        &self,
        feeds: &Feeds,
        opts: &RunOptions,
        observer: &mut dyn FnMut(&str, &Tensor),
    ) -> Result<RunResult> {
        self.run_impl(
            self.feed_values(feeds)?,
            &[],
            opts,
            None,
            Some(observer),
            None,
            true,
            None,
            None,
        )
    }

    /// Runs with the input slots holding `inputs` (in order) and the outer names `outer`;
    /// `nested`: the observer also sees the values inside subgraphs.
    #[allow(clippy::too_many_arguments)]
    fn run_impl(
        &self,
        inputs: Vec<Arc<Tensor>>,
        outer: &[Option<&Tensor>],
        opts: &RunOptions,
        plan: Option<&PreparedPlan>,
        mut observer: Option<Observer>,
        mut cache: Option<(&mut ValueCache, u64)>,
        nested: bool,
        stop_after: Option<usize>,
        mut profile: Option<&mut Vec<LayerTime>>,
    ) -> Result<RunResult> {
        if let Some(p) = plan {
            if p.layers.len() != self.steps.len() {
                return Err(Error::Invalid(
                    "the precision plan was prepared for another graph".into(),
                ));
            }
        }
        let accumulate = plan.map(|p| p.accumulate).unwrap_or_default();
        let mut values: Slots<Option<Arc<Tensor>>> = Slots::new(&self.values, None);
        // The float precision each value is already rounded to, so a consumer in the same
        // precision does not round (and copy) it again.
        let mut rounded: Slots<Option<Precision>> = Slots::new(&self.values, None);
        // Fusion regions: the f32 values of outputs that leave a region and are also read
        // inside it (the slot holds the rounded value the region materializes).
        let mut fused: Slots<Option<Arc<Tensor>>> = Slots::new(&self.values, None);
        for (&slot, t) in self.input_slots.iter().zip(inputs) {
            if let Some(obs) = observer.as_mut() {
                obs(self.values.name(slot), &t);
            }
            values[slot] = Some(t);
        }
        // With a cache: which layers can be taken from it, and which of their values this run
        // actually needs (graph outputs and inputs of layers that execute).
        let mut sigs: Slots<u64> = Slots(Vec::new());
        let mut hit: Vec<bool> = Vec::new();
        let mut needed: Slots<bool> = Slots(Vec::new());
        let mut dead: Vec<bool> = Vec::new();
        if let Some((c, feed_key)) = cache.as_mut() {
            sigs = self.signatures(plan, *feed_key);
            c.begin_run();
            hit = self
                .steps
                .iter()
                .map(|st| {
                    let outs: Vec<ValueId> = st.outputs.iter().flatten().copied().collect();
                    !outs.is_empty() && outs.iter().all(|&s| c.contains(sigs[s]))
                })
                .collect();
            emulate::whole_regions(plan, &mut hit);
            // An observer sees every value, so every value is materialized (and freed after use).
            needed = Slots::new(&self.values, opts.keep_intermediates || observer.is_some());
            for &(s, held) in &self.output_slots {
                if held {
                    needed[s] = true;
                }
            }
            // Backwards: a layer not in the cache runs when a value it makes is needed (a
            // graph output, or read by a layer that runs); then its inputs are needed. A
            // layer whose readers all come from the cache does not run: the layers inside an
            // epilogue whose result is cached (their values were never stored).
            dead = vec![false; self.steps.len()];
            for (idx, st) in self.steps.iter().enumerate().rev() {
                if hit[idx] {
                    continue;
                }
                if !st.outputs.iter().flatten().any(|&s| needed[s]) {
                    dead[idx] = true;
                    continue;
                }
                for src in &st.inputs {
                    if let Source::Slot(s) = src {
                        needed[*s] = true;
                    }
                }
            }
            for (st, &h) in self.steps.iter().zip(&hit) {
                if h {
                    for &s in st.outputs.iter().flatten() {
                        if needed[s] {
                            c.pin(sigs[s]);
                        }
                    }
                }
            }
        }
        // Epilogues run where nothing can tell their layers' values were never stored (a
        // cache keeps an epilogue's result only: the values inside it have no other reader).
        let epilogues = observer.is_none() && !opts.keep_intermediates;
        // The values this run's producers quantize as they write them, for readers that all
        // quantize them alike (see `quantized_on_write`); not with a cache, whose entries are
        // keyed by how their producers computed them.
        let quantize_on_write: &[Option<(f32, Precision)>] = match plan {
            Some(p) if epilogues && cache.is_none() => self.quantized_on_write(p),
            _ => &[],
        };
        // Which of them were written quantized.
        let mut quantized: Slots<bool> = match quantize_on_write.is_empty() {
            true => Slots(Vec::new()),
            false => Slots::new(&self.values, false),
        };
        // Steps whose work an epilogue did.
        let mut done_in_epilogue = vec![false; self.steps.len()];
        // Folded weight nodes run only where their values are shown.
        let skip_folded = observer.is_none() && !opts.keep_intermediates;
        for (idx, (node, step)) in self.graph.nodes.iter().zip(&self.steps).enumerate() {
            if done_in_epilogue[idx]
                || (step.folded && skip_folded)
                || dead.get(idx).copied().unwrap_or(false)
            {
                for &s in &step.frees {
                    values[s] = None;
                }
                continue;
            }
            if stop_after.is_some_and(|last| idx > last) {
                // A partial run ([`Interpreter::run_cached_until`]): the observer has seen
                // what it asked for; the graph outputs are not computed.
                return Ok(RunResult::default());
            }
            let layer = plan.map(|p| &p.layers[idx]);
            if let (Some((c, _)), true) = (cache.as_mut(), hit.get(idx).copied().unwrap_or(false)) {
                c.stats.reused += 1;
                for &s in step.outputs.iter().flatten() {
                    if needed[s] {
                        let (t, mark) = c.fetch(sigs[s]).expect("hit entries are pinned");
                        if let Some(obs) = observer.as_mut() {
                            obs(self.values.name(s), &t);
                        }
                        values[s] = Some(t);
                        rounded[s] = mark;
                    } else {
                        c.touch(sigs[s]);
                    }
                }
                if !opts.keep_intermediates {
                    for &s in &step.frees {
                        values[s] = None;
                    }
                }
                continue;
            }
            let acc = match layer.and_then(|l| l.precision) {
                Some(Precision::Float16 | Precision::BFloat16) => accumulate,
                _ => crate::precision::Accumulator::F32,
            };
            // The layers fused into this one (an epilogue's, a scaled product's Cast and Mul,
            // or the rest of an RMS normalization), in graph order: the last one's output is
            // what this step writes.
            let mut fused_steps: Args<usize> = Args::new();
            let (mut outs, movement_mark, cost, kernel_rounded, rms_shapes) = {
                let fusion = layer.and_then(|l| l.fusion.as_ref());
                // Declared first, so dropped last: the argument lists below may borrow it
                // (their type, a SmallVec, does not let a borrow end before its drop).
                let widened: Vec<Option<Tensor>>;
                let base: Args<Option<&Tensor>> = step
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(i, src)| match src {
                        Source::Initializer(_, t) => Some(*t),
                        Source::Slot(s) if fusion.is_some_and(|f| f.internal[i]) => {
                            fused[*s].as_deref().or(values[*s].as_deref())
                        }
                        Source::Slot(s) => values[*s].as_deref(),
                        Source::Outer(i) => outer.get(*i).copied().flatten(),
                        Source::Absent => None,
                    })
                    .collect();
                // A decomposed RMS normalization that starts here, computed whole where this
                // run allows (`rms`): the value it normalizes as stored (the kernel rounds it as
                // each layer reads it, so no rounded copy is made for the square below).
                let rms_norm = (self.rms[idx].as_ref())
                    .filter(|_| epilogues && self.scaled[idx].is_none())
                    .and_then(|r| {
                        let x = values[r.x()].as_deref()?;
                        let layers = plan.map(|p| p.layers.as_slice());
                        let on = rounded[r.x()];
                        Some((r, x, r.layers(idx, &self.steps, x, on, layers, accumulate)?))
                    });
                // Converted copies of activations, where the layer's precision asks for them.
                let owned: Args<Option<Tensor>> = match layer {
                    None => Args::new(),
                    Some(_) if rms_norm.is_some() => Args::new(),
                    Some(l) => base
                        .iter()
                        .zip(&l.inputs)
                        .zip(&step.inputs)
                        .enumerate()
                        .map(|(i, ((t, prep), src))| {
                            // A float32 layer of TensorRT 11.3's float16 attention with FP32
                            // accumulation reads this operand in float16.
                            let float16 =
                                fusion.is_some_and(|f| f.float16_operands.get(i) == Some(&true));
                            let already = match (prep, src) {
                                (InputPrep::Round(p), Source::Slot(s)) => rounded[*s] == Some(*p),
                                (_, Source::Slot(s)) if float16 => {
                                    rounded[*s] == Some(Precision::Float16)
                                }
                                _ => false,
                            };
                            match (t, prep) {
                                (Some(t), _) if float16 && !already => emulate::float16_operand(
                                    t,
                                    matches!(src, Source::Initializer(..)),
                                ),
                                // The kernel rounds it as it reads it (`weight_rounding`).
                                (_, InputPrep::RoundedByKernel(_)) => None,
                                // Its producer wrote it quantized.
                                (_, InputPrep::Quantize { .. })
                                    if matches!(src, Source::Slot(s)
                                        if quantized.0.get(s.index()) == Some(&true)) =>
                                {
                                    None
                                }
                                (Some(t), _) if !already => emulate::prepare_input(prep, t),
                                _ => None,
                            }
                        })
                        .collect(),
                };
                let args: Args<Option<&Tensor>> = base
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        if let Some(Some(o)) = owned.get(i) {
                            return Some(o);
                        }
                        if let Some(InputPrep::Converted(c, _)) =
                            layer.and_then(|l| l.inputs.get(i))
                        {
                            return Some(&**c);
                        }
                        *t
                    })
                    .collect();
                // A natively 16-bit layer inside a region computes in f32 (the fused kernel's
                // accumulator type): its 16-bit inputs are widened, exactly.
                widened = match fusion.and_then(|f| f.native) {
                    Some(d) => args
                        .iter()
                        .map(|t| {
                            t.filter(|t| t.dtype() == d).map(|t| {
                                crate::ops::cast::cast_tensor(t, crate::tensor::DType::F32)
                            })
                        })
                        .collect(),
                    None => Vec::new(),
                };
                let args: Args<Option<&Tensor>> = if widened.is_empty() {
                    args
                } else {
                    args.iter()
                        .zip(&widened)
                        .map(|(t, w)| w.as_ref().or(*t))
                        .collect()
                };
                // A data-movement layer's outputs are rounded to p when every f32 value it
                // reads is.
                let mut movement_mark = None;
                if layer.is_some_and(|l| l.precision.is_none()) {
                    let mut marks =
                        step.inputs
                            .iter()
                            .zip(&base)
                            .filter_map(|(src, t)| match (src, t) {
                                (_, Some(t)) if t.dtype() != crate::tensor::DType::F32 => None,
                                (Source::Slot(s), Some(_)) => Some(rounded[*s]),
                                (_, Some(_)) => Some(None),
                                _ => None,
                            });
                    if let Some(first) = marks.next() {
                        if marks.all(|m| m == first) {
                            movement_mark = first;
                        }
                    }
                }
                let (args, implicit) = args.split_at(step.explicit);
                let nested_observer = match observer.as_mut() {
                    Some(o) if nested && !step.subs.is_empty() => {
                        let o: &mut dyn FnMut(&str, &Tensor) = &mut **o;
                        Some(std::cell::RefCell::new(o))
                    }
                    _ => None,
                };
                // A profiled run lends its layer times to the node's subgraphs while it runs.
                let before = profile.as_ref().map_or(0, |t| t.len());
                let nested_profile = (!step.subs.is_empty() && profile.is_some())
                    .then(|| std::cell::RefCell::new(profile.take()));
                let runner = ScopeRunner {
                    subs: &step.subs,
                    plans: layer.map(|l| l.subplans.as_slice()),
                    implicit,
                    node: &node.name,
                    observer: nested_observer.as_ref(),
                    profile: nested_profile.as_ref(),
                };
                // Where the kernel may keep what it derives from an input (packed weights):
                // with the plan's converted weight, or with the step for a graph initializer
                // passed as it is.
                let prepacked: Args<Option<&crate::ops::prepacked::Prepacked>> = (0..step.explicit)
                    .map(|i| match layer.and_then(|l| l.inputs.get(i)) {
                        Some(InputPrep::Converted(_, kept)) => Some(&**kept),
                        // The stored weight's own place: the kernel keeps its rounded forms
                        // under tags of their own.
                        None | Some(InputPrep::Keep | InputPrep::RoundedByKernel(_)) => {
                            match step.inputs[i] {
                                Source::Initializer(..) => step.prepacked.get(i),
                                _ => None,
                            }
                        }
                        _ => None,
                    })
                    .collect();
                // The pointwise layers after this one, as its epilogue.
                let prepared =
                    |chain: &epilogue::Chain| -> Result<Option<Arc<epilogue::Epilogue>>> {
                        match step.epilogue_shape.and_then(|f| f(args)) {
                            Some(shape) => plan
                                .map_or(&self.epilogues, |p| &p.epilogues)
                                .get_or_make(idx, shape, chain, chain_origins(plan, chain), || {
                                    let e = epilogue::Epilogue::prepare(
                                        chain,
                                        chain.head,
                                        self.graph,
                                        &self.steps,
                                        plan.map(|p| p.layers.as_slice()),
                                        shape,
                                    )?;
                                    // A chain after a scaled product's Mul (its head) runs
                                    // after the integer kernel, which rounds as the Mul writes.
                                    Ok(e.map(|e| match chain.head != idx {
                                        true => e.after_rounded_anchor(),
                                        false => e,
                                    }))
                                }),
                            None => Ok(None),
                        }
                    };
                // The Cast and Mul after an integer kernel, computed by it, where this run
                // allows (`scaled`) and the scale is known.
                let scaled = self.scaled[idx]
                    .as_ref()
                    .filter(|_| epilogues)
                    .and_then(|sp| {
                        let rounding = sp.applies(idx, plan.map(|p| p.layers.as_slice()))?;
                        let scale = match &self.steps[sp.mul].inputs[sp.scale] {
                            Source::Slot(s) => values[*s].as_deref(),
                            Source::Initializer(_, t) => Some(*t),
                            Source::Outer(_) | Source::Absent => None,
                        }?;
                        // The scale as the Mul reads it.
                        let rounded = rounding
                            .scale
                            .and_then(|p| emulate::prepare_input(&InputPrep::Round(p), scale));
                        let kernel_rounding = crate::ops::ScaledRounding {
                            cast: rounding.cast.and_then(|p| p.float_rounding()),
                            output: rounding.output.and_then(|p| p.float_rounding()),
                        };
                        Some((sp, scale, rounded, kernel_rounding))
                    });
                // A chain after a scaled product's Mul only where the kernel computes them.
                let chain = match (&self.chains[idx], args.first().copied().flatten()) {
                    (Some(chain), _) if chain.head != idx => {
                        Some(chain).filter(|_| scaled.is_some())
                    }
                    (Some(chain), Some(x))
                        if epilogues && x.dtype() == crate::tensor::DType::F32 =>
                    {
                        Some(chain)
                    }
                    _ => None,
                };
                // The values of other layers the chain reads (a residual Add's other operand):
                // at hand, float32 and of one shape, the shape the kernel's output must have
                // for it to apply the epilogue. Where they are not, or the output has another
                // shape, the chain's layers before the first that reads one (its `fallback`)
                // are the epilogue, and the rest run on their own.
                let operands: Option<Args<&Tensor>> = chain.and_then(|c| {
                    let ts: Option<Args<&Tensor>> =
                        c.operands.iter().map(|&s| values[s].as_deref()).collect();
                    ts.filter(|ts| {
                        ts.iter().all(|t| {
                            t.dtype() == crate::tensor::DType::F32 && t.shape() == ts[0].shape()
                        })
                    })
                });
                let (first, otherwise) = match (chain, &operands) {
                    (None, _) => (None, None),
                    (Some(c), Some(_)) => (Some(c), c.fallback.as_deref()),
                    (Some(c), None) => (c.fallback.as_deref(), None),
                };
                let fused_epilogue = match first {
                    Some(c) => prepared(c)?.map(|e| (c, e)),
                    None => None,
                };
                let fallback_epilogue = match otherwise {
                    Some(c) => prepared(c)?.map(|e| (c, e)),
                    None => None,
                };
                // With the grid each is on (as the layer that wrote it rounded it).
                let operand_values: Args<epilogue::Operand> = (operands.iter().flatten())
                    .zip(chain.map_or(&[][..], |c| &c.operands[..]))
                    .map(|(t, &s)| epilogue::Operand {
                        values: t.as_f32().expect("float32"),
                        on: rounded[s].and_then(|p| p.float_rounding()),
                    })
                    .collect();
                let epilogue_shape = fused_epilogue
                    .as_ref()
                    .filter(|(c, _)| !c.operands.is_empty())
                    .and_then(|_| Some(operands.as_ref()?.first()?.shape()));
                // The epilogue's output quantized too, where every reader quantizes it alike.
                let quantized_out = |fused: &Option<(&epilogue::Chain, _)>| {
                    fused
                        .as_ref()
                        .filter(|_| !quantize_on_write.is_empty())
                        .and_then(|(chain, _)| {
                            let last = chain.steps().last()?;
                            let out = (self.steps[last].outputs.first()).copied().flatten()?;
                            quantize_on_write[out.index()].map(|q| (out, q))
                        })
                };
                let quantize_out = quantized_out(&fused_epilogue);
                let quantize_fallback_out = quantized_out(&fallback_epilogue);
                let apply = |piece: crate::ops::Piece, v: &mut [f32]| {
                    if let Some((_, e)) = &fused_epilogue {
                        e.apply(piece, v, &operand_values);
                        if let Some((_, (scale, p))) = quantize_out {
                            crate::precision::quant::fake_quant_piece(v, scale, p);
                        }
                    }
                };
                let apply_fallback = |piece: crate::ops::Piece, v: &mut [f32]| {
                    if let Some((_, e)) = &fallback_epilogue {
                        e.apply(piece, v, &[]);
                        if let Some((_, (scale, p))) = quantize_fallback_out {
                            crate::precision::quant::fake_quant_piece(v, scale, p);
                        }
                    }
                };
                let weight_rounding: Args<Option<crate::numeric::Rounding>> = (0..step.explicit)
                    .map(|i| match layer.and_then(|l| l.inputs.get(i)) {
                        Some(InputPrep::RoundedByKernel(r)) => Some(*r),
                        _ => None,
                    })
                    .collect();
                let ctx = OpCtx {
                    node,
                    opset: step.opset,
                    subgraphs: (!step.subs.is_empty()).then_some(&runner as &dyn SubgraphRunner),
                    accumulate: acc,
                    state: emulate::state_type(layer.and_then(|l| l.precision)),
                    // Kernels may round as they write only where the interpreter would round
                    // every output afterwards: a plain (unfused, not quantized) layer in float16
                    // or bfloat16.
                    round_to: layer
                        .filter(|l| l.fusion.is_none() && l.integer.is_none())
                        .filter(|_| fused_epilogue.is_none())
                        .and_then(|l| l.precision?.float_rounding()),
                    rounded: Default::default(),
                    prepacked: &prepacked,
                    epilogue: fused_epilogue
                        .as_ref()
                        .map(|_| &apply as &crate::ops::ChannelFn),
                    epilogue_shape,
                    epilogue_otherwise: fallback_epilogue
                        .as_ref()
                        .map(|_| &apply_fallback as &crate::ops::ChannelFn),
                    took_otherwise: Default::default(),
                    // Not where the epilogue's output is quantized too (after the stages).
                    epilogue_store: fused_epilogue
                        .as_ref()
                        .filter(|_| quantize_out.is_none())
                        .and_then(|(_, e)| e.store_form(&operand_values)),
                    weight_rounding: &weight_rounding,
                };
                // A quantized kernel (Q/DQ absorbed, `--fusion tensorrt`) replaces the op's own.
                let started = profile.is_some().then(std::time::Instant::now);
                // The fused kernel rounded its output as its last layer's (the scaled product's
                // Mul, in the pass that scales; the normalization's last layer).
                let mut fused_rounded = false;
                let outs = match (layer.and_then(|l| l.integer.as_deref()), &scaled) {
                    (Some(k), _) => k.run(&ctx, args),
                    (None, None) if rms_norm.is_some() => {
                        let (r, x, layers) = rms_norm.as_ref().expect("checked");
                        let v = x.as_f32().expect("a float32 input (RmsNorm::layers)");
                        let width = *x.shape().last().expect("rank >= 1");
                        let mut out = vec![0f32; v.len()];
                        crate::ops::rms_decomposed::rms_rows(v, width, layers, &mut out);
                        fused_steps.extend(r.steps());
                        fused_rounded = true;
                        Ok(vec![Tensor::from_f32(x.shape().to_vec(), out)])
                    }
                    (None, Some((sp, scale, rounded, rounding))) => {
                        match (sp.kernel)(&ctx, args, rounded.as_ref().unwrap_or(scale), *rounding)
                        {
                            Ok(Some(t)) => {
                                fused_steps.extend(sp.steps());
                                fused_rounded = rounding.output.is_some();
                                Ok(vec![t])
                            }
                            // A scale that broadcasts the output: the layers run one by one.
                            Ok(None) => (step.kernel)(&ctx, args),
                            Err(e) => Err(e),
                        }
                    }
                    (None, None) => (step.kernel)(&ctx, args),
                }
                .map_err(|e| Error::Op {
                    node: node.name.clone(),
                    op: node.op_type.clone(),
                    msg: e.0,
                })?;
                // A kernel that could not take its epilogue (an output it does not compute in
                // float32) leaves the layers to run on their own, its output rounded below.
                let (applied, quantized_as_written) = match ctx.took_otherwise() {
                    false => (&fused_epilogue, quantize_out),
                    true => (&fallback_epilogue, quantize_fallback_out),
                };
                if let Some((chain, _)) = applied.as_ref().filter(|_| ctx.did_round()) {
                    fused_steps.extend(chain.steps());
                    if let Some((out, _)) = quantized_as_written {
                        quantized[out] = true;
                    }
                }
                for &s in &fused_steps {
                    done_in_epilogue[s] = true;
                }
                let elapsed = started.map(|t0| t0.elapsed().as_secs_f64());
                if let Some(cell) = nested_profile.as_ref() {
                    profile = cell.borrow_mut().take();
                }
                if let (Some(times), Some(elapsed)) = (profile.as_deref_mut(), elapsed) {
                    let fused = fused_steps.to_vec();
                    // Its subgraphs' layers were listed while it ran: its own time is the rest.
                    let nested: f64 = times[before..].iter().map(|t| t.seconds).sum();
                    times.push(LayerTime {
                        node: idx,
                        scope: String::new(),
                        name: node.name.clone(),
                        op_type: node.op_type.clone(),
                        seconds: (elapsed - nested).max(0.0),
                        fused_ops: fused
                            .iter()
                            .map(|&j| self.graph.nodes[j].op_type.clone())
                            .collect(),
                        fused,
                    });
                }
                let cost = match cache {
                    Some(_) => {
                        let ins: Vec<Option<Vec<usize>>> =
                            args.iter().map(|t| t.map(|t| t.shape().to_vec())).collect();
                        let shapes: Vec<Vec<usize>> =
                            outs.iter().map(|t| t.shape().to_vec()).collect();
                        crate::inspect::node_flops(node, &ins, &shapes)
                    }
                    None => 0,
                };
                // The normalization computed here, and its input's shape (for the FLOP counts).
                let rms_shapes = rms_norm.map(|(r, x, _)| (r, x.shape().to_vec()));
                (
                    outs,
                    movement_mark,
                    cost,
                    ctx.did_round() || fused_rounded,
                    rms_shapes,
                )
            };
            // What the outputs are rounded to: the layer's float precision, or for data
            // movement whatever its first input was. An epilogue's output is its last
            // layer's, in that layer's precision.
            let written_by = match fused_steps.last() {
                Some(&last) => plan.map(|p| &p.layers[last]),
                None => layer,
            };
            let kept = self.steps[fused_steps.last().copied().unwrap_or(idx)].kept_outputs;
            let (marks, inner) = match written_by {
                Some(l) if l.fusion.is_some() => {
                    let f = l.fusion.as_ref().expect("checked");
                    emulate::finish_fused_outputs(
                        f,
                        kept,
                        l.precision.is_some(),
                        movement_mark,
                        &mut outs,
                    )
                }
                Some(l) => match l.precision {
                    Some(p) => (
                        emulate::round_layer_outputs(p, kept, &mut outs, kernel_rounded),
                        Vec::new(),
                    ),
                    None => (vec![movement_mark; outs.len()], Vec::new()),
                },
                None => (vec![None; outs.len()], Vec::new()),
            };
            if outs.len() < step.outputs.iter().filter(|o| o.is_some()).count() {
                return Err(Error::Op {
                    node: node.name.clone(),
                    op: node.op_type.clone(),
                    msg: format!(
                        "kernel produced {} outputs, the node declares {}",
                        outs.len(),
                        step.outputs.len()
                    ),
                });
            }
            // Shared from here on: the cache keeps a reference instead of a copy.
            let outs: Args<Arc<Tensor>> = outs.into_iter().map(Arc::new).collect();
            // An epilogue's output is its last layer's.
            let out_slots = match fused_steps.last() {
                Some(&last) => &self.steps[last].outputs[..1],
                None => step.outputs.as_slice(),
            };
            if let Some((c, _)) = cache.as_mut() {
                c.stats.executed += 1;
                c.layer_flops.insert(idx, cost);
                let mut cost = cost;
                if let (false, Some(out)) = (fused_steps.is_empty(), outs.first()) {
                    // The fused layers ran too: their work as if alone, for the search's FLOP
                    // counts (every chain value has the anchor's output shape; a
                    // normalization's statistics one value per row).
                    let shape = |s: ValueId| match &rms_shapes {
                        Some((r, x)) => r.shape_of(s, x, &self.steps),
                        None => out.shape().to_vec(),
                    };
                    for &j in &fused_steps {
                        let ins: Vec<Option<Vec<usize>>> = (self.steps[j].inputs.iter())
                            .map(|src| match src {
                                Source::Slot(s) => Some(shape(*s)),
                                Source::Initializer(_, t) => Some(t.shape().to_vec()),
                                Source::Outer(_) | Source::Absent => None,
                            })
                            .collect();
                        let written = self.steps[j].outputs.first().copied().flatten();
                        let flops = crate::inspect::node_flops(
                            &self.graph.nodes[j],
                            &ins,
                            &[written.map_or_else(|| out.shape().to_vec(), shape)],
                        );
                        c.stats.executed += 1;
                        c.layer_flops.insert(j, flops);
                        cost += flops;
                    }
                }
                for ((slot, t), &mark) in out_slots.iter().zip(&outs).zip(&marks) {
                    if let Some(s) = slot {
                        c.insert(sigs[*s], t, mark, cost);
                    }
                }
            }
            let mut inner = inner.into_iter();
            for ((slot, t), mark) in out_slots.iter().zip(outs).zip(marks) {
                let f32_copy = inner.next().flatten();
                if let Some(s) = slot {
                    if let Some(obs) = observer.as_mut() {
                        obs(self.values.name(*s), &t);
                    }
                    values[*s] = Some(t);
                    // A value written quantized is in no float precision's grid.
                    rounded[*s] = mark.filter(|_| quantized.0.get(s.index()) != Some(&true));
                    fused[*s] = f32_copy.map(Arc::new);
                }
            }
            for &s in &step.frees {
                fused[s] = None;
                if !opts.keep_intermediates {
                    values[s] = None;
                }
            }
        }
        let mut outputs = Vec::with_capacity(self.output_slots.len());
        for &(id, held) in &self.output_slots {
            let name = self.values.name(id);
            let t = match held {
                // Without intermediates to return, the value can be moved out (a copy only
                // when the cache shares it).
                true if !opts.keep_intermediates => values[id].take().map(Arc::unwrap_or_clone),
                true => values[id].as_deref().cloned(),
                false => self.graph.initializers.get(name).cloned().or_else(|| {
                    let i = self.outer_names.iter().position(|o| o == name)?;
                    outer.get(i).copied().flatten().cloned()
                }),
            };
            let t = t.ok_or_else(|| {
                Error::Invalid(format!("graph output '{name}' is not produced by any node"))
            })?;
            outputs.push((name.to_string(), t));
        }
        let mut intermediates = HashMap::new();
        if opts.keep_intermediates {
            for id in self.values.ids() {
                if let Some(t) = values[id].take() {
                    intermediates.insert(self.values.name(id).to_string(), Arc::unwrap_or_clone(t));
                }
            }
        }
        Ok(RunResult {
            outputs,
            intermediates,
        })
    }

    /// Per value slot: the per-tensor quantization (scale, precision) every reader applies to
    /// it, where all its readers are int8/fp8 layers that quantize it alike as an activation
    /// operand (`InputPrep::Quantize`; not fused into a region, an epilogue or a scaled
    /// product) and it is not a graph output. Its producer's epilogue may then quantize it as
    /// it writes it, in cache, and the readers take it as it is: they compute the same values
    /// without a quantized copy each (a separate pass over every activation of an int8 run:
    /// PP-OCR's classifier 1.14× its FP32 run with it, 1.02 without). Empty where no slot
    /// qualifies.
    fn quantized_on_write<'p>(&self, plan: &'p PreparedPlan) -> &'p [Option<(f32, Precision)>] {
        plan.quantized_on_write.0.get_or_init(|| {
            // Steps whose work another step's kernel does.
            let mut fused_away = vec![false; self.steps.len()];
            let chained = self.chains.iter().flatten().flat_map(|c| c.steps());
            let scaled = self.scaled.iter().flatten().flat_map(|s| s.steps());
            for j in chained.chain(scaled) {
                fused_away[j] = true;
            }
            // Per slot: the quantization its readers so far apply, or Err where one does not.
            let mut state: Vec<Option<std::result::Result<(f32, Precision), ()>>> =
                vec![None; self.values.len()];
            // Every step's every input (implicit ones too: a subgraph reads the value as is).
            for (j, step) in self.steps.iter().enumerate() {
                let layer = &plan.layers[j];
                let plain = !fused_away[j] && layer.fusion.is_none() && layer.integer.is_none();
                for (i, src) in step.inputs.iter().enumerate() {
                    let Source::Slot(id) = src else { continue };
                    let q = match layer.inputs.get(i) {
                        Some(InputPrep::Quantize { scale, precision })
                            if plain && i < step.explicit =>
                        {
                            Some((*scale, *precision))
                        }
                        _ => None,
                    };
                    let slot = &mut state[id.index()];
                    *slot = match (q, *slot) {
                        (Some(q), None) => Some(Ok(q)),
                        (Some(q), Some(Ok(s))) if q.0.to_bits() == s.0.to_bits() && q.1 == s.1 => {
                            Some(Ok(s))
                        }
                        _ => Some(Err(())),
                    };
                }
            }
            for &(id, _) in &self.output_slots {
                state[id.index()] = Some(Err(()));
            }
            let mut out: Vec<Option<(f32, Precision)>> =
                state.into_iter().map(|s| s.and_then(|s| s.ok())).collect();
            if out.iter().all(Option::is_none) {
                out.clear();
            }
            out
        })
    }

    /// The signature of every value slot under `plan` on the input set `feed_key` (see
    /// [`cache`]): equal signatures mean equal bits.
    fn signatures(&self, plan: Option<&PreparedPlan>, feed_key: u64) -> Slots<u64> {
        use cache::{hash_str, mix};
        let mut sig = Slots::new(&self.values, 0u64);
        for &s in &self.input_slots {
            sig[s] = mix(mix(feed_key, hash_str(self.values.name(s))), 1);
        }
        let accumulate = plan.map(|p| p.accumulate).unwrap_or_default();
        for (idx, (node, step)) in self.graph.nodes.iter().zip(&self.steps).enumerate() {
            let mut h = mix(0x006d_6978_7072_6563, idx as u64);
            h = mix(h, hash_str(&node.name));
            // The layer's treatment: precision (plain FP32 runs are float32 layers), the
            // accumulator its kernels use, and how each input is prepared.
            let precision = match plan {
                Some(p) => p.layers[idx].precision,
                None => (!crate::ops::is_data_movement(node)).then_some(Precision::Float32),
            };
            h = mix(h, precision.map_or(0, |p| p as u64 + 1));
            h = mix(h, emulate::fusion_signature(plan.map(|p| &p.layers[idx])));
            if plan.is_some_and(|p| p.layers[idx].integer.is_some()) {
                h = mix(h, 0x7164_7169_6e74);
            }
            if matches!(precision, Some(Precision::Float16 | Precision::BFloat16))
                || !step.subs.is_empty()
            {
                h = mix(h, accumulate as u64 + 1);
            }
            // Subgraphs: the precisions of their nodes.
            if let Some(p) = plan {
                for sp in &p.layers[idx].subplans {
                    h = mix(h, hash_str(&format!("{:?}", sp.plan)));
                }
            }
            for (i, src) in step.inputs.iter().enumerate() {
                // Implicit inputs (read by subgraphs) have no preparation of their own.
                let prep = plan.and_then(|p| p.layers[idx].inputs.get(i));
                h = mix(
                    h,
                    match prep {
                        None | Some(InputPrep::Keep) => 1,
                        Some(InputPrep::Round(p)) => mix(2, *p as u64),
                        Some(InputPrep::Quantize { scale, precision }) => {
                            mix(mix(3, scale.to_bits() as u64), *precision as u64)
                        }
                        Some(InputPrep::Converted(..)) => mix(4, precision.map_or(0, |p| p as u64)),
                        Some(InputPrep::RoundedByKernel(r)) => mix(5, *r as u64),
                    },
                );
                h = mix(
                    h,
                    match src {
                        Source::Initializer(n, _) => mix(hash_str(n), 2),
                        Source::Slot(s) => sig[*s],
                        Source::Outer(i) => mix(*i as u64, 4),
                        Source::Absent => 3,
                    },
                );
            }
            for (o, slot) in step.outputs.iter().enumerate() {
                if let Some(s) = slot {
                    sig[*s] = mix(h, o as u64 + 17);
                }
            }
        }
        sig
    }

    /// Runs the shape and type inference for the feeds' shapes (once per distinct set of
    /// shapes), so that inputs a node cannot take are an error naming the node before any
    /// kernel runs.
    pub fn check_shapes(&self, feeds: &Feeds) -> Result<()> {
        let key: Vec<Vec<usize>> = feeds.values().map(|t| t.shape().to_vec()).collect();
        if self
            .checked_shapes
            .lock()
            .map(|c| c.contains(&key))
            .unwrap_or(false)
        {
            return Ok(());
        }
        crate::infer::infer_graph(self.graph, &crate::infer::feed_facts(feeds))?;
        if let Ok(mut c) = self.checked_shapes.lock() {
            c.insert(key);
        }
        Ok(())
    }

    /// Every graph input present with the declared dtype, rank and fixed dims; no extras.
    pub fn check_feeds(&self, feeds: &Feeds) -> Result<()> {
        for name in feeds.keys() {
            if self.graph.input(name).is_none() {
                let known: Vec<&str> = self.graph.inputs.iter().map(|v| v.name.as_str()).collect();
                return Err(Error::input(
                    name,
                    format!(
                        "the model has no such input (its inputs: {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        for vi in &self.graph.inputs {
            let t = feeds
                .get(&vi.name)
                .ok_or_else(|| Error::input(&vi.name, "no data was given for this model input"))?;
            check_against(vi, t)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, ValueInfo};

    /// Runs `plan` as is and without epilogues (`keep_intermediates`: every layer on its own,
    /// each reader quantizing its own copy), asserts every output has the same bits, and
    /// returns the first run's result.
    fn same_bits_without_epilogues(
        interp: &Interpreter,
        feeds: &Feeds,
        plan: &PreparedPlan,
        what: &str,
    ) -> RunResult {
        let fused = interp
            .run_plan(feeds, &RunOptions::default(), plan)
            .unwrap();
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let apart = interp.run_plan(feeds, &keep, plan).unwrap();
        let bits =
            |t: &Tensor| -> Vec<u32> { t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect() };
        for ((name, a), (_, b)) in fused.outputs.iter().zip(&apart.outputs) {
            assert_eq!(bits(a), bits(b), "{what}: {name}");
        }
        fused
    }

    /// A value whose readers all quantize it alike (int8 MatMuls with one scale) is written
    /// quantized by its producer's epilogue; one with another reader, or a graph output, is
    /// not. Either way every output has the bits of a run without epilogues (each reader
    /// quantizing its own copy): with the value also read by a float32 Add, quantizing it in
    /// the producer would change that Add's output.
    #[test]
    fn values_every_reader_quantizes_alike_are_quantized_as_written() {
        use crate::exec::emulate::PlanOptions;
        use crate::precision::plan::PrecisionPlan;
        let k = 48;
        let weight = |seed: u32| {
            let mut r = crate::data::loader::Mt19937::new(seed);
            let v = (0..k * k).map(|_| r.random_sample() as f32 - 0.5).collect();
            Tensor::from_f32(vec![k, k], v)
        };
        let x: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![2, k], x));
        let mut amax = std::collections::BTreeMap::new();
        amax.insert("x".to_string(), 1.0f32);
        amax.insert("y".to_string(), 3.0f32);
        let opts = PlanOptions {
            amax: Some(&amax),
            ..PlanOptions::default()
        };
        // x → MatMul → Relu (its epilogue) → y; y → two int8 MatMuls, and in `shared` also a
        // float32 Add; in `output`, y is a graph output as well.
        for case in ["alike", "shared", "output"] {
            let mut nodes = vec![
                node("mm0", "MatMul", &["x", "w0"], &["a"]),
                node("relu", "Relu", &["a"], &["y"]),
                node("mm1", "MatMul", &["y", "w1"], &["z1"]),
                node("mm2", "MatMul", &["y", "w2"], &["z2"]),
                node("sum", "Add", &["z1", "z2"], &["z"]),
            ];
            let mut outputs = vec![vi("z", &[2, k])];
            let mut layers = vec![
                Precision::Float32,
                Precision::Float32,
                Precision::Int8,
                Precision::Int8,
                Precision::Float32,
            ];
            match case {
                "shared" => {
                    nodes.push(node("add", "Add", &["y", "z"], &["u"]));
                    outputs.push(vi("u", &[2, k]));
                    layers.push(Precision::Float32);
                }
                "output" => outputs.push(vi("y", &[2, k])),
                _ => {}
            }
            let g = graph(
                nodes,
                vec![vi("x", &[2, k])],
                outputs,
                vec![("w0", weight(1)), ("w1", weight(2)), ("w2", weight(3))],
            );
            let plan = PreparedPlan::new(&g, &PrecisionPlan::from_layers(layers), &opts).unwrap();
            let interp = Interpreter::new(&g).unwrap();
            let y = interp.values.id("y").unwrap();
            let marked = interp
                .quantized_on_write(&plan)
                .get(y.index())
                .copied()
                .flatten();
            assert_eq!(marked.is_some(), case == "alike", "{case}");
            if let Some((scale, p)) = marked {
                assert_eq!((scale, p), (3.0 / 127.0, Precision::Int8));
            }
            let fused = same_bits_without_epilogues(&interp, &feeds, &plan, case);
            // The run is not the float32 one: the readers did quantize.
            let float = interp.run(&feeds).unwrap();
            assert_ne!(float.outputs[0].1, fused.outputs[0].1, "{case}");
        }
    }

    /// Convolutions as producers, on each of their paths (the gathered product with its
    /// epilogue on short planes' block rows and on long planes' pieces, the depthwise loop
    /// writing its planes): the value their Relu epilogue writes quantized for two int8
    /// convolutions gives the bits of the run without epilogues.
    #[test]
    fn convolutions_write_quantized_values_on_every_path() {
        use crate::exec::emulate::PlanOptions;
        use crate::graph::Attribute;
        use crate::precision::plan::PrecisionPlan;
        let mut r = crate::data::loader::Mt19937::new(7);
        let mut values =
            |n: usize| -> Vec<f32> { (0..n).map(|_| r.random_sample() as f32 - 0.5).collect() };
        // (channels, side, depthwise producer)
        for (c, side, depthwise) in [(16, 6, false), (16, 20, false), (16, 12, true)] {
            let (cg, group) = if depthwise { (1, c) } else { (c, 1) };
            let w0 = Tensor::from_f32(vec![c, cg, 3, 3], values(c * cg * 9));
            let w1 = Tensor::from_f32(vec![c, c, 3, 3], values(c * c * 9));
            let w2 = Tensor::from_f32(vec![8, c, 1, 1], values(8 * c));
            let conv = |name: &str, ins: &[&str], out: &str, pad: i64, group: i64| {
                let mut n = node(name, "Conv", ins, &[out]);
                n.attrs.insert("pads".into(), Attribute::Ints(vec![pad; 4]));
                n.attrs.insert("group".into(), Attribute::Int(group));
                n
            };
            let g = graph(
                vec![
                    conv("c0", &["x", "w0"], "a", 1, group as i64),
                    node("relu", "Relu", &["a"], &["y"]),
                    conv("c1", &["y", "w1"], "z1", 1, 1),
                    conv("c2", &["y", "w2"], "z2", 0, 1),
                ],
                vec![vi("x", &[1, c, side, side])],
                vec![vi("z1", &[1, c, side, side]), vi("z2", &[1, 8, side, side])],
                vec![("w0", w0), ("w1", w1), ("w2", w2)],
            );
            let mut feeds = Feeds::new();
            let x = values(c * side * side);
            feeds.insert("x".into(), Tensor::from_f32(vec![1, c, side, side], x));
            let mut amax = std::collections::BTreeMap::new();
            amax.insert("y".to_string(), 1.5f32);
            let opts = PlanOptions {
                amax: Some(&amax),
                ..PlanOptions::default()
            };
            let layers = vec![
                Precision::Float32,
                Precision::Float32,
                Precision::Int8,
                Precision::Int8,
            ];
            let plan = PreparedPlan::new(&g, &PrecisionPlan::from_layers(layers), &opts).unwrap();
            let interp = Interpreter::new(&g).unwrap();
            let y = interp.values.id("y").unwrap();
            assert!(interp.quantized_on_write(&plan)[y.index()].is_some());
            let what = format!("{c}×{side}², depthwise {depthwise}");
            same_bits_without_epilogues(&interp, &feeds, &plan, &what);
        }
    }

    /// A subgraph reads an enclosing graph's initializer as a weight (`Source::Initializer`,
    /// so a kernel keeps its packed panels across runs), an enclosing activation as an outer
    /// value; the result is the bits of the same layer in the main graph.
    #[test]
    fn a_subgraph_reads_enclosing_weights_as_initializers() {
        let branch = |out: &str| {
            graph(
                vec![node("mm", "MatMul", &["x", "w"], &[out])],
                vec![],
                vec![vi(out, &[3, 2])],
                vec![],
            )
        };
        let mut cf = node("if", "If", &["cond"], &["y"]);
        cf.attrs.insert(
            "then_branch".into(),
            Attribute::Graph(Arc::new(branch("y_then"))),
        );
        cf.attrs.insert(
            "else_branch".into(),
            Attribute::Graph(Arc::new(branch("y_else"))),
        );
        let w = Tensor::from_f32(vec![4, 2], (0..8).map(|v| v as f32 * 0.377 - 1.3).collect());
        let inputs = vec![
            ValueInfo {
                name: "cond".into(),
                dtype: Some(crate::tensor::DType::Bool),
                shape: Some(vec![]),
            },
            vi("x", &[3, 4]),
        ];
        let nested = graph(
            vec![cf],
            inputs.clone(),
            vec![vi("y", &[3, 2])],
            vec![("w", w.clone())],
        );
        let flat = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            inputs,
            vec![vi("y", &[3, 2])],
            vec![("w", w)],
        );
        let interp = Interpreter::new(&nested).unwrap();
        let sub = &interp.steps[0].subs[1].interp;
        assert!(matches!(&sub.steps[0].inputs[0], Source::Outer(_)));
        assert!(matches!(&sub.steps[0].inputs[1], Source::Initializer(n, _) if n == "w"));
        let mut feeds = Feeds::new();
        feeds.insert("cond".into(), Tensor::from_bool(vec![], vec![true]));
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.71 - 3.3).collect()),
        );
        let y = |interp: &Interpreter| {
            // Twice: the second run reads the panels the first one packed.
            (0..2)
                .map(|_| {
                    let r = interp.run(&feeds).unwrap();
                    r.outputs[0].1.as_f32().unwrap().to_vec()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(y(&interp), y(&Interpreter::new(&flat).unwrap()));
    }
}
