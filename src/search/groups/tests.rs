use super::*;
use crate::graph::fact::{shape_fact_of, Fact};
use crate::graph::testing::{graph, node, vi};
use crate::precision::plan::parse_layer_precisions;
use crate::tensor::DType;

/// A graph of `(name, op)` nodes chained through one value each (names are what matters).
fn named<S: AsRef<str>>(nodes: &[(S, &str)]) -> Graph {
    let mut prev = "x".to_string();
    let mut built = Vec::new();
    for (k, (name, op)) in nodes.iter().enumerate() {
        let out = format!("v{k}");
        built.push(node(name.as_ref(), op, &[&prev], &[&out]));
        prev = out;
    }
    let last = prev.clone();
    graph(built, vec![vi("x", &[4])], vec![vi(&last, &[4])], vec![])
}

fn all(g: &Graph) -> Vec<usize> {
    (0..g.nodes.len()).collect()
}

/// Each role as (template text or the lone layer's name, block indices).
fn described(g: &Graph, roles: &Roles) -> Vec<(String, Vec<u64>)> {
    roles
        .groups
        .iter()
        .map(|r| match &r.template {
            Some(t) => (format!("{}{{}}{}", t.prefix, t.suffix), r.blocks.clone()),
            None => (g.nodes[r.layers[0]].name.clone(), Vec::new()),
        })
        .collect()
}

/// The nodes an item of `--layer-precisions` selects, as the precision plan resolves it.
fn selected(g: &Graph, item: &str) -> Vec<usize> {
    let (pattern, _) = parse_layer_precisions(&[item.to_string()])
        .unwrap()
        .remove(0);
    (0..g.nodes.len())
        .filter(|&i| pattern.matches(&g.nodes[i].name))
        .collect()
}

/// Pytorch/Optimum's Llama export: every RMSNorm op and projection of 4 layers.
fn llama(blocks: usize) -> Graph {
    let mut names: Vec<(String, &str)> = vec![("/model/embed_tokens/Gather".into(), "Gather")];
    for b in 0..blocks {
        for (role, op) in [
            ("input_layernorm/Pow", "Pow"),
            ("input_layernorm/ReduceMean", "ReduceMean"),
            ("input_layernorm/Add", "Add"),
            ("input_layernorm/Sqrt", "Sqrt"),
            ("self_attn/q_proj/MatMul", "MatMul"),
            ("self_attn/MatMul_1", "MatMul"),
        ] {
            names.push((format!("/model/layers.{b}/{role}"), op));
        }
    }
    names.push(("/model/norm/Pow".into(), "Pow"));
    names.push(("/lm_head/MatMul".into(), "MatMul"));
    named(&names)
}

#[test]
fn pytorch_layers_group_by_the_block_index_and_the_rest_stands_alone() {
    let g = llama(4);
    let r = roles(&g, None, &all(&g));
    let d = described(&g, &r);
    assert_eq!(d.len(), 6 + 3, "{d:?}");
    assert_eq!(d[0], ("/model/embed_tokens/Gather".into(), vec![]));
    assert_eq!(
        d[1],
        (
            "/model/layers.{}/input_layernorm/Pow".into(),
            vec![0, 1, 2, 3]
        )
    );
    // A per-scope counter in the node's own name is part of the role, not a block index.
    assert!(d.contains(&(
        "/model/layers.{}/self_attn/MatMul_1".into(),
        vec![0, 1, 2, 3]
    )));
    assert_eq!(d[7], ("/model/norm/Pow".into(), vec![]));
    assert_eq!(d[8], ("/lm_head/MatMul".into(), vec![]));
    assert_eq!(r.repeated(), 6);
    let q = r.group_of(5).unwrap();
    assert_eq!(
        g.nodes[q.layers[0]].name,
        "/model/layers.0/self_attn/q_proj/MatMul"
    );
    assert_eq!(q.layers.len(), 4);
    assert_eq!(q.op, "MatMul");
}

#[test]
fn naming_schemes_of_other_exporters() {
    // ONNX Runtime GenAI's builder (its contrib ops; the final norm sits in an extra layer).
    let mut genai: Vec<(String, &str)> = Vec::new();
    for b in 0..3 {
        genai.push((
            format!("/model/layers.{b}/attn/GroupQueryAttention"),
            "GroupQueryAttention",
        ));
        genai.push((
            format!("/model/layers.{b}/input_layernorm/SkipLayerNorm"),
            "SkipLayerNormalization",
        ));
    }
    genai.push((
        "/model/layers.3/final_norm_layernorm/SkipLayerNorm".into(),
        "SkipLayerNormalization",
    ));
    // HF BERT, ViT, tf2onnx/keras.
    let mut other: Vec<(String, &str)> = Vec::new();
    for b in 0..3 {
        other.push((
            format!("/encoder/layer.{b}/attention/self/MatMul_1"),
            "MatMul",
        ));
        other.push((format!("/blocks.{b}/attn/qkv/MatMul"), "MatMul"));
        other.push((format!("model/block_{b}/conv2d/Conv2D"), "Conv"));
    }
    for (names, expected) in [
        (
            genai,
            vec![
                ("/model/layers.{}/attn/GroupQueryAttention", 3),
                ("/model/layers.{}/input_layernorm/SkipLayerNorm", 3),
                ("/model/layers.3/final_norm_layernorm/SkipLayerNorm", 0),
            ],
        ),
        (
            other,
            vec![
                ("/encoder/layer.{}/attention/self/MatMul_1", 3),
                ("/blocks.{}/attn/qkv/MatMul", 3),
                ("model/block_{}/conv2d/Conv2D", 3),
            ],
        ),
    ] {
        let g = named(&names);
        let r = roles(&g, None, &all(&g));
        let got: Vec<(String, usize)> = described(&g, &r)
            .into_iter()
            .map(|(t, b)| (t, b.len()))
            .collect();
        let want: Vec<(String, usize)> = expected.iter().map(|&(t, n)| (t.into(), n)).collect();
        assert_eq!(got, want);
    }
    // The scope of a tf2onnx block drops the separator.
    let g = named(&[
        ("model/block_3/conv2d/Conv2D", "Conv"),
        ("model/block_4/conv2d/Conv2D", "Conv"),
    ]);
    let rules = rules(&g, &roles(&g, None, &all(&g)), &[0, 1]);
    assert_eq!(rules[0].describe(), "conv2d/Conv2D in model/block 3–4");
}

#[test]
fn t5_groups_by_the_block_not_by_the_sub_layer() {
    // Each block's two sub-layers have a layer norm of the same op: the block index repeats
    // more (5 blocks) than the sub-layer index (2), so roles run across blocks.
    let mut names: Vec<(String, &str)> = Vec::new();
    for b in 0..5 {
        names.push((format!("/encoder/block.{b}/layer.0/layer_norm/Mul"), "Mul"));
        names.push((
            format!("/encoder/block.{b}/layer.0/SelfAttention/q/MatMul"),
            "MatMul",
        ));
        names.push((format!("/encoder/block.{b}/layer.1/layer_norm/Mul"), "Mul"));
        names.push((
            format!("/encoder/block.{b}/layer.1/DenseReluDense/wi/MatMul"),
            "MatMul",
        ));
    }
    let g = named(&names);
    let r = roles(&g, None, &all(&g));
    let d = described(&g, &r);
    assert_eq!(
        d.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
        [
            "/encoder/block.{}/layer.0/layer_norm/Mul",
            "/encoder/block.{}/layer.0/SelfAttention/q/MatMul",
            "/encoder/block.{}/layer.1/layer_norm/Mul",
            "/encoder/block.{}/layer.1/DenseReluDense/wi/MatMul",
        ]
    );
    assert!(d.iter().all(|(_, b)| b == &[0, 1, 2, 3, 4]));
}

#[test]
fn other_ops_or_shapes_or_unscoped_numbers_are_not_a_role() {
    // The same name in two blocks but another op: each stands alone. Global counters in
    // the node's own name (old exporters: `MatMul_123`) are never a block index.
    let g = named(&[
        ("/model/layers.0/mlp/act/Act", "Sigmoid"),
        ("/model/layers.1/mlp/act/Act", "Tanh"),
        ("MatMul_12", "MatMul"),
        ("MatMul_13", "MatMul"),
        ("/model/layers.05/mlp/Mul", "Mul"),
        ("/model/layers.06/mlp/Mul", "Mul"),
    ]);
    let r = roles(&g, None, &all(&g));
    assert_eq!(r.groups.len(), 6);
    assert_eq!(r.repeated(), 0);
    // Same op and name scheme, other output shapes (as shape inference would give them):
    // different roles; equal shapes (a symbolic dimension counts as equal): one role.
    let g = named(&[
        ("/features.1/conv/Conv", "Conv"),
        ("/features.2/conv/Conv", "Conv"),
        ("/features.3/conv/Conv", "Conv"),
    ]);
    let mut facts = GraphFacts::default();
    facts.values.insert(
        "v0".into(),
        Fact::typed(DType::F32, shape_fact_of(&[1, 16, 8, 8])),
    );
    facts.values.insert(
        "v1".into(),
        Fact::typed(DType::F32, shape_fact_of(&[1, 16, 8, 8])),
    );
    facts.values.insert(
        "v2".into(),
        Fact::typed(DType::F32, shape_fact_of(&[1, 32, 4, 4])),
    );
    let r = roles(&g, Some(&facts), &all(&g));
    assert_eq!(r.layer_sets(), vec![vec![0, 1], vec![2]]);
    // Without shape facts the op alone confirms the role.
    assert_eq!(roles(&g, None, &all(&g)).groups.len(), 1);
    // Only the given layers are grouped.
    let r = roles(&g, None, &[2, 0]);
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.groups[0].layers, vec![0, 2]);
    assert!(r.group_of(1).is_none());
}

#[test]
fn ranges_read_as_runs() {
    assert_eq!(ranges(&(2..=29).collect::<Vec<_>>()), "2–29");
    assert_eq!(ranges(&[9, 2, 5, 7, 8]), "2, 5, 7–9");
    assert_eq!(ranges(&[4]), "4");
    assert_eq!(ranges(&[]), "");
}

#[test]
fn index_regexes_match_exactly_their_numbers() {
    // Every set of a few runs below 1200 against every spelling up to 1300 (and leading zeros).
    let sets: Vec<Vec<u64>> = vec![
        (2..=29).collect(),
        vec![0],
        vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        vec![7, 9, 11, 12, 13, 99, 100, 101],
        (95..=1104).collect(),
        (1..=999).collect(),
        vec![19, 20, 29, 30, 31, 199, 200, 1000],
        (10..=19).chain(30..=47).collect(),
    ];
    for set in sets {
        let re = regex::Regex::new(&format!("^(?:{})$", index_set_regex(&set))).unwrap();
        for x in 0..1300u64 {
            assert_eq!(
                re.is_match(&x.to_string()),
                set.contains(&x),
                "{x} vs {set:?}: {re}"
            );
            assert!(
                !re.is_match(&format!("0{x}")) || set.is_empty(),
                "0{x}: {re}"
            );
        }
    }
    assert_eq!(
        index_set_regex(&(2..=29).collect::<Vec<_>>()),
        "[2-9]|[1-2][0-9]"
    );
}

#[test]
fn an_answer_reads_as_rules_that_name_exactly_its_layers() {
    let g = llama(6);
    let r = roles(&g, None, &all(&g));
    let by_name = |n: &str| g.nodes.iter().position(|x| x.name == n).unwrap();
    // The RMSNorm of layers 2–5, q_proj of layers 1 and 3, the final norm.
    let mut marked = Vec::new();
    for b in 2..6 {
        for leaf in ["Pow", "ReduceMean", "Add", "Sqrt"] {
            marked.push(by_name(&format!(
                "/model/layers.{b}/input_layernorm/{leaf}"
            )));
        }
    }
    marked.push(by_name("/model/layers.1/self_attn/q_proj/MatMul"));
    marked.push(by_name("/model/layers.3/self_attn/q_proj/MatMul"));
    marked.push(by_name("/model/norm/Pow"));
    let rules = rules(&g, &r, &marked);
    let lines: Vec<String> = rules.iter().map(Rule::describe).collect();
    assert_eq!(
        lines,
        [
            "self_attn/q_proj/MatMul in /model/layers 1, 3",
            "input_layernorm/{Pow,ReduceMean,Add,Sqrt} in /model/layers 2–5",
            "/model/norm/Pow",
        ]
    );
    let norm = &rules[1];
    assert_eq!(norm.block_indices, vec![2, 3, 4, 5]);
    assert_eq!(norm.ops, ["Pow", "ReduceMean", "Add", "Sqrt"]);
    assert_eq!(norm.layers.len(), 16);
    assert_eq!(
        norm.regex,
        r"^/model/layers\.(?:[2-5])/input_layernorm/(?:Pow|ReduceMean|Add|Sqrt)$"
    );
    assert!(!rules[2].is_group());
    // Each rule, as a --layer-precisions item, selects exactly its layers; together they
    // select the answer.
    let mut union = Vec::new();
    for rule in &rules {
        let mut want = rule.indices.clone();
        want.sort_unstable();
        assert_eq!(
            selected(&g, &format!("re:{}:float32", rule.regex)),
            want,
            "{rule:?}"
        );
        union.extend(want);
    }
    union.sort_unstable();
    let mut sorted = marked.clone();
    sorted.sort_unstable();
    assert_eq!(union, sorted);
    // Roles whose blocks differ are separate rules (Pow in one block more than the rest).
    let mut more = marked.clone();
    more.push(by_name("/model/layers.0/input_layernorm/Pow"));
    let lines: Vec<String> = rules_of(&g, &r, &more);
    assert!(
        lines.contains(&"input_layernorm/Pow in /model/layers 0, 2–5".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"input_layernorm/{ReduceMean,Add,Sqrt} in /model/layers 2–5".to_string()),
        "{lines:?}"
    );
}

fn rules_of(g: &Graph, r: &Roles, marked: &[usize]) -> Vec<String> {
    rules(g, r, marked).iter().map(Rule::describe).collect()
}

#[test]
fn a_pattern_that_would_catch_other_nodes_falls_back_to_the_names() {
    let g = named(&[("a.1", "Relu"), ("a/1", "Relu"), ("ab1", "Relu")]);
    // An over-broad pattern (as a name with regex characters could give): the names instead.
    let re = checked_regex(&g, "^a.1$".into(), &[0]);
    assert_eq!(re, r"^(?:a\.1)$");
    assert_eq!(selected(&g, &format!("re:{re}:float32")), vec![0]);
    assert_eq!(checked_regex(&g, r"^a\.1$".into(), &[0]), r"^a\.1$");
    // A lone layer's rule is its escaped name.
    let rule = &rules(&g, &roles(&g, None, &all(&g)), &[0])[0];
    assert_eq!(rule.regex, r"^a\.1$");
    assert_eq!(rule.describe(), "a.1");
}

#[test]
fn grouping_parses_its_flag_values() {
    assert_eq!(Grouping::parse("roles").unwrap(), Grouping::Roles);
    assert_eq!(Grouping::parse("none").unwrap(), Grouping::None);
    let e = Grouping::parse("blocks").unwrap_err().to_string();
    assert!(e.contains("--group 'blocks'"), "{e}");
    assert_eq!(Grouping::default(), Grouping::None);
}

#[test]
fn shape_facts_confirm_roles_on_a_model_built_in_code() {
    // Shape inference from the declared inputs tells these two Muls apart (one broadcasts to
    // [2,4]) although their names and ops agree.
    let g = graph(
        vec![
            node("/m/layers.0/scale/Mul", "Mul", &["x", "w"], &["a"]),
            node("/m/layers.1/scale/Mul", "Mul", &["a", "w"], &["b"]),
            node("/m/layers.2/scale/Mul", "Mul", &["b", "w2"], &["y"]),
        ],
        vec![vi("x", &[4])],
        vec![vi("y", &[2, 4])],
        vec![
            ("w", crate::tensor::Tensor::from_f32(vec![1], vec![2.0])),
            (
                "w2",
                crate::tensor::Tensor::from_f32(vec![2, 4], vec![0.5; 8]),
            ),
        ],
    );
    let facts = shape_facts(&g).expect("inferable");
    let r = roles(&g, Some(&facts), &all(&g));
    assert_eq!(r.layer_sets(), vec![vec![0, 1], vec![2]]);
}
