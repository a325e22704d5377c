//! `cleave explain --svg DIR`: the three pictures, read back as XML and checked against what
//! the text commands print (the declared listing, the chosen graph's expression and program),
//! so a picture that drops an op, an edge or a tensor fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use roxmltree::{Document, Node};

const KERNELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");

fn cleave(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cleave")).args(args).output().expect("the cleave binary runs");
    assert!(out.status.success(), "cleave {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("explain-svg").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `explain --svg` and returns its text and the three pictures.
fn explain(kernel: &str, dir: &Path) -> (String, [String; 3]) {
    let text = cleave(&["explain", KERNELS, "--kernel", kernel, "--svg", dir.to_str().expect("utf-8 path")]);
    let read = |what: &str| {
        std::fs::read_to_string(dir.join(format!("{kernel}.{what}.svg"))).unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    (text, [read("declared"), read("chosen"), read("schedule")])
}

fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(heading).unwrap_or_else(|| panic!("no {heading}")) + heading.len();
    let rest = &text[start..];
    &rest[..rest.find("\n== ").unwrap_or(rest.len())]
}

fn has_class(n: Node<'_, '_>, class: &str) -> bool {
    n.attribute("class").is_some_and(|c| c.split(' ').any(|x| x == class))
}

/// The op boxes of a graph picture: (op name, its classes, the first line of its label).
fn op_boxes(svg: &str) -> Vec<(String, String, String)> {
    let doc = Document::parse(svg).expect("well-formed SVG");
    doc.descendants()
        .filter(|n| n.has_tag_name("g") && has_class(*n, "op"))
        .map(|g| {
            let label = g.children().find(|c| c.has_tag_name("text")).and_then(|t| t.text()).unwrap_or_default();
            (
                g.attribute("data-op").expect("an op box names its op").to_string(),
                g.attribute("class").unwrap_or_default().to_string(),
                label.to_string(),
            )
        })
        .collect()
}

fn edge_count(svg: &str) -> usize {
    let doc = Document::parse(svg).expect("well-formed SVG");
    doc.descendants().filter(|n| n.has_tag_name("path") && has_class(*n, "edge")).count()
}

/// The op names of the declared listing (`%5 = matmul(q, %4)  [h, s, l]`) and how many edges
/// it implies: one per operand that is not a constant, plus one per output.
fn listing_ops(listing: &str) -> (BTreeMap<String, usize>, usize) {
    let mut ops = BTreeMap::new();
    let mut edges = 0;
    for line in listing.lines() {
        if let Some((_, call)) = line.split_once(" = ").filter(|_| line.starts_with('%')) {
            let (name, args) = call.split_once('(').expect("a call");
            *ops.entry(name.to_string()).or_insert(0) += 1;
            let args = &args[..args.rfind(')').expect("closed")];
            edges += args.split(", ").filter(|a| !a.starts_with("axis=") && a.parse::<f64>().is_err()).count();
        } else if line.contains(" <- ") {
            edges += 1;
        }
    }
    (ops, edges)
}

/// The op names an infix expression uses: calls by name, and the operators by theirs.
fn expression_ops(expr: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut word = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_alphanumeric() || *c == '_' {
            word.push(*c);
            continue;
        }
        if *c == '(' && !word.is_empty() && word.chars().next().is_some_and(char::is_alphabetic) {
            out.insert(word.clone());
        }
        word.clear();
        let spaced = i > 0 && chars[i - 1] == ' ' && chars.get(i + 1) == Some(&' ');
        match c {
            '*' if spaced => out.insert("mul".into()),
            '/' if spaced => out.insert("div".into()),
            '+' if spaced => out.insert("add".into()),
            '-' if spaced => out.insert("sub".into()),
            // A minus after an operand or inside a number (`1e-5`) is not a negation.
            '-' if i == 0 || matches!(chars[i - 1], '(' | ' ' | ',') => out.insert("neg".into()),
            _ => false,
        };
    }
    out
}

#[test]
fn the_graph_pictures_draw_every_op_and_edge_and_mark_what_the_search_changed() {
    for kernel in ["mha_d64_prefill", "mha_d64_decode", "rmsnorm_matmul_prefill", "swiglu_decode"] {
        let dir = scratch(kernel);
        let (text, [declared, chosen, _]) = explain(kernel, &dir);

        // The declared picture: the listing's ops, one box each, and its edges.
        let (want, edges) = listing_ops(section(&text, "== declared graph =="));
        let boxes = op_boxes(&declared);
        let mut got = BTreeMap::new();
        for (op, class, label) in &boxes {
            *got.entry(op.clone()).or_insert(0) += 1;
            assert!(label.starts_with(op.as_str()), "{kernel}: box of {op} labelled {label:?}");
            assert!(!class.contains("rewritten") && !class.contains("split"), "{kernel}: {class}");
        }
        assert_eq!(got, want, "{kernel}: the declared picture's ops");
        assert_eq!(edge_count(&declared), edges, "{kernel}: the declared picture's edges");

        // The chosen picture: the ops of the chosen graph as `schedule --json` prints it.
        let json: serde_json::Value =
            serde_json::from_str(&cleave(&["schedule", KERNELS, "--kernel", kernel, "--json"])).expect("JSON");
        let best = &json["candidates"][0];
        let expr = best["graph"].as_str().expect("the chosen graph");
        let boxes = op_boxes(&chosen);
        let names: std::collections::BTreeSet<String> =
            boxes.iter().map(|(op, ..)| if op == "reduce_max" { "max".to_string() } else { op.clone() }).collect();
        assert_eq!(names, expression_ops(expr), "{kernel}: the chosen picture's ops for {expr}");
        let split = best["has_split"].as_bool().expect("has_split");
        for (op, class, _) in &boxes {
            if op == "split" {
                assert!(class.contains("split"), "{kernel}: a split box is not marked: {class}");
            }
        }
        let merges = boxes.iter().filter(|(op, class, _)| op == "sum" && class.contains("split")).count();
        assert_eq!(merges > 0, split, "{kernel}: the sums that merge splits are marked iff the graph splits");
        if kernel == "mha_d64_prefill" {
            // The FlashAttention form: the division comes after the second matmul.
            assert!(expr.starts_with("o = matmul("), "{expr}");
            let div = boxes.iter().find(|b| b.0 == "div").expect("a division");
            assert!(div.1.contains("rewritten"), "the moved division is not highlighted: {}", div.1);
        }
    }
}

/// The statements of one kernel's program: (loop depth, text).
fn program_lines(program: &str) -> Vec<Vec<(usize, String)>> {
    let mut kernels = Vec::new();
    for line in program.lines() {
        if line.starts_with("# ") {
            kernels.push(Vec::new());
        } else if line.starts_with("  ") {
            let depth = (line.len() - line.trim_start().len()) / 2 - 1;
            if let Some(k) = kernels.last_mut() {
                k.push((depth, line.trim().to_string()));
            }
        }
    }
    kernels
}

#[test]
fn the_schedule_picture_shows_each_statement_in_its_loop_and_each_tensor_at_its_level() {
    for kernel in ["mha_d64_decode", "rmsnorm_matmul_prefill"] {
        let dir = scratch(&format!("{kernel}-schedule"));
        let (text, [_, _, schedule]) = explain(kernel, &dir);
        let kernels = program_lines(section(&text, "== chosen program =="));
        let doc = Document::parse(&schedule).expect("well-formed SVG");
        let groups: Vec<Node<'_, '_>> =
            doc.descendants().filter(|n| n.has_tag_name("g") && has_class(*n, "kernel")).collect();
        assert_eq!(groups.len(), kernels.len(), "{kernel}: one panel per kernel");
        for (g, lines) in groups.iter().zip(&kernels) {
            let level = |name: &str| {
                g.descendants()
                    .find(|n| n.attribute("data-name") == Some(name))
                    .and_then(|n| n.attribute("data-level"))
                    .unwrap_or_else(|| panic!("{kernel}: {name} is not listed"))
                    .to_string()
            };
            let stmts: Vec<(f64, f64, String)> = g
                .descendants()
                .filter(|n| n.has_tag_name("text") && has_class(*n, "stmt"))
                .map(|t| {
                    let s: String = t.descendants().filter(|d| d.is_text()).filter_map(|d| d.text()).collect();
                    let x: f64 = t.attribute("x").and_then(|v| v.parse().ok()).expect("x");
                    let y: f64 = t.attribute("y").and_then(|v| v.parse().ok()).expect("y");
                    (x, y, s)
                })
                .collect();
            let texts: Vec<&str> = stmts.iter().map(|s| s.2.as_str()).collect();
            let want: Vec<&str> = lines.iter().map(|l| l.1.as_str()).collect();
            assert_eq!(texts, want, "{kernel}: the program's lines, in order");
            let loops: Vec<(f64, f64, f64)> = g
                .descendants()
                .filter(|n| n.has_tag_name("rect") && has_class(*n, "loop"))
                .map(|r| {
                    let f = |a: &str| r.attribute(a).and_then(|v| v.parse::<f64>().ok()).expect("a number");
                    (f("x"), f("y"), f("y") + f("height"))
                })
                .collect();
            for (i, (depth, line)) in lines.iter().enumerate() {
                // A statement at depth d sits inside d loop boxes; a loop's own line heads one more.
                let (x, y, _) = stmts[i];
                let inside = loops.iter().filter(|(lx, y0, y1)| *lx < x && *y0 < y && y < *y1).count();
                let want = depth + usize::from(line.starts_with("for "));
                assert_eq!(inside, want, "{kernel}: `{line}` is inside {inside} loop boxes");
                if let Some((lhs, rhs)) = line.split_once(" = Load(") {
                    assert_eq!(level(lhs), "smem", "{kernel}: {line}");
                    assert_eq!(level(rhs.split('[').next().expect("a tensor")), "gmem", "{kernel}: {line}");
                }
                if line.contains("MMA(") {
                    assert_eq!(level(line.split(' ').next().expect("an accumulator")), "reg", "{kernel}: {line}");
                }
                if let Some(args) = line.strip_prefix("Store(") {
                    let head = &args[..args.rfind('[').expect("an indexed tensor")];
                    let param = head.rsplit([' ', '(', ',']).next().expect("a tensor");
                    assert_eq!(level(param), "gmem", "{kernel}: {line}");
                }
            }
        }
    }
}

#[test]
fn the_same_declaration_draws_the_same_bytes() {
    let a = explain("mha_d64_decode", &scratch("same-a")).1;
    let b = explain("mha_d64_decode", &scratch("same-b")).1;
    assert_eq!(a, b);
}
