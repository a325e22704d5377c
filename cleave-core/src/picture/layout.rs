//! Layered drawing of a DAG (the Sugiyama scheme): ranks by longest path, dummy nodes on long
//! edges, crossing reduction by barycentre sweeps, and coordinates by isotonic regression so
//! that each node sits as close as it can to the mean of its neighbours without overlapping.
//!
//! Everything is deterministic: ties keep the previous order, and no hash map decides an
//! order, so the same graph gives the same picture.

/// Horizontal gap between neighbouring boxes of one rank.
const GAP: f64 = 28.0;
/// Vertical gap between ranks.
const RANK_GAP: f64 = 46.0;
/// Width reserved for a dummy node, so that long edges keep apart.
const DUMMY_W: f64 = 10.0;
/// Barycentre sweeps (down and up) tried; the ordering with the fewest crossings is kept.
const SWEEPS: usize = 12;
/// Coordinate passes.
const PASSES: usize = 8;

/// Where everything went: box centres, and each edge's route from the bottom of its source
/// to the top of its target through the dummy points.
pub(crate) struct Placed {
    pub(crate) centers: Vec<(f64, f64)>,
    pub(crate) routes: Vec<Vec<(f64, f64)>>,
    pub(crate) width: f64,
    pub(crate) height: f64,
}

/// Lays out boxes of the given `(width, height)` joined by `edges` (source, target), top to
/// bottom, inside a `margin`. Every edge must go from a smaller index to a larger one (the
/// boxes in topological order); an edge that does not is drawn but does not rank.
pub(crate) fn layered(sizes: &[(f64, f64)], edges: &[(usize, usize)], margin: (f64, f64)) -> Placed {
    let n = sizes.len();
    let mut rank = vec![0usize; n];
    for v in 0..n {
        for &(a, b) in edges {
            if b == v && a < v {
                rank[v] = rank[v].max(rank[a] + 1);
            }
        }
    }

    // Nodes, real then dummy, each with its rank and width; edges between adjacent ranks.
    let mut node_rank = rank.clone();
    let mut width: Vec<f64> = sizes.iter().map(|s| s.0).collect();
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(edges.len());
    let mut links: Vec<(usize, usize)> = Vec::new();
    for &(a, b) in edges {
        let mut chain = vec![a];
        if a < b {
            for r in rank[a] + 1..rank[b] {
                node_rank.push(r);
                width.push(DUMMY_W);
                chain.push(node_rank.len() - 1);
            }
        }
        chain.push(b);
        for w in chain.windows(2) {
            if node_rank[w[1]] == node_rank[w[0]] + 1 {
                links.push((w[0], w[1]));
            }
        }
        chains.push(chain);
    }
    let total = node_rank.len();
    let ranks = node_rank.iter().max().map_or(0, |r| r + 1);
    let mut layers: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (v, &r) in node_rank.iter().enumerate() {
        layers[r].push(v);
    }
    let preds = neighbours(total, &links, false);
    let succs = neighbours(total, &links, true);

    let layers = order(layers, &preds, &succs, &links, &node_rank);

    // Row heights and y centres.
    let mut row_h = vec![0.0f64; ranks];
    for v in 0..n {
        row_h[rank[v]] = row_h[rank[v]].max(sizes[v].1);
    }
    let mut y_mid = vec![0.0; ranks];
    let mut y = margin.1;
    for r in 0..ranks {
        y_mid[r] = y + row_h[r] / 2.0;
        y += row_h[r] + RANK_GAP;
    }

    let x = coordinates(&layers, &width, &preds, &succs, total);
    let left = (0..total).map(|v| x[v] - width[v] / 2.0).fold(f64::INFINITY, f64::min);
    let shift = if left.is_finite() { margin.0 - left } else { margin.0 };
    let right = (0..total).map(|v| x[v] + width[v] / 2.0 + shift).fold(margin.0, f64::max);

    let centers: Vec<(f64, f64)> = (0..n).map(|v| (x[v] + shift, y_mid[rank[v]])).collect();
    let routes = chains
        .iter()
        .map(|chain| {
            let (a, b) = (chain[0], chain[chain.len() - 1]);
            let mut pts = vec![(centers[a].0, centers[a].1 + sizes[a].1 / 2.0)];
            for &d in &chain[1..chain.len() - 1] {
                pts.push((x[d] + shift, y_mid[node_rank[d]]));
            }
            pts.push((centers[b].0, centers[b].1 - sizes[b].1 / 2.0));
            pts
        })
        .collect();
    Placed { centers, routes, width: right + margin.0, height: (y - RANK_GAP + margin.1).max(2.0 * margin.1) }
}

fn neighbours(total: usize, links: &[(usize, usize)], forward: bool) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); total];
    for &(a, b) in links {
        if forward {
            out[a].push(b);
        } else {
            out[b].push(a);
        }
    }
    out
}

/// Barycentre sweeps: each rank sorted by the mean position of its neighbours in the rank just
/// swept. The ordering with the fewest crossings seen is kept.
fn order(
    mut layers: Vec<Vec<usize>>,
    preds: &[Vec<usize>],
    succs: &[Vec<usize>],
    links: &[(usize, usize)],
    node_rank: &[usize],
) -> Vec<Vec<usize>> {
    let mut pos = vec![0usize; node_rank.len()];
    let index = |layers: &[Vec<usize>], pos: &mut [usize]| {
        for l in layers {
            for (i, &v) in l.iter().enumerate() {
                pos[v] = i;
            }
        }
    };
    index(&layers, &mut pos);
    let mut best = (crossings(links, &pos, node_rank), layers.clone());
    for sweep in 0..SWEEPS {
        let down = sweep % 2 == 0;
        for r in sweep_ranks(layers.len(), down) {
            let adj = if down { preds } else { succs };
            let mut keyed: Vec<(f64, usize)> = layers[r]
                .iter()
                .map(|&v| {
                    let ns = &adj[v];
                    let key = if ns.is_empty() {
                        pos[v] as f64
                    } else {
                        ns.iter().map(|&u| pos[u] as f64).sum::<f64>() / ns.len() as f64
                    };
                    (key, v)
                })
                .collect();
            // A stable sort: equal keys keep the current order.
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
            layers[r] = keyed.into_iter().map(|(_, v)| v).collect();
            for (i, &v) in layers[r].iter().enumerate() {
                pos[v] = i;
            }
        }
        let c = crossings(links, &pos, node_rank);
        if c < best.0 {
            best = (c, layers.clone());
        }
    }
    best.1
}

/// The ranks a sweep visits: downward from the second, or upward from the second to last, each
/// placed against the rank it has just left.
fn sweep_ranks(ranks: usize, down: bool) -> Vec<usize> {
    if down {
        (1..ranks).collect()
    } else {
        (0..ranks.saturating_sub(1)).rev().collect()
    }
}

/// Pairs of links between the same two ranks that cross.
fn crossings(links: &[(usize, usize)], pos: &[usize], node_rank: &[usize]) -> usize {
    let mut n = 0;
    for (i, &(a, b)) in links.iter().enumerate() {
        for &(c, d) in &links[i + 1..] {
            if node_rank[a] == node_rank[c] {
                let (pa, pb, pc, pd) = (pos[a], pos[b], pos[c], pos[d]);
                if (pa < pc && pb > pd) || (pa > pc && pb < pd) {
                    n += 1;
                }
            }
        }
    }
    n
}

/// x centres: packed first, then pulled toward the mean of each node's neighbours, alternately
/// from above and below, keeping each rank's order and gaps.
fn coordinates(
    layers: &[Vec<usize>],
    width: &[f64],
    preds: &[Vec<usize>],
    succs: &[Vec<usize>],
    total: usize,
) -> Vec<f64> {
    let mut x = vec![0.0f64; total];
    for l in layers {
        let mut at = 0.0;
        for &v in l {
            x[v] = at + width[v] / 2.0;
            at += width[v] + GAP;
        }
    }
    // Centre every rank on the widest one before pulling, so that a lone node starts mid-way.
    let span = |l: &Vec<usize>, x: &[f64]| match (l.first(), l.last()) {
        (Some(&a), Some(&b)) => (x[a] - width[a] / 2.0, x[b] + width[b] / 2.0),
        _ => (0.0, 0.0),
    };
    let widest = layers.iter().map(|l| span(l, &x).1).fold(0.0, f64::max);
    for l in layers {
        let (_, right) = span(l, &x);
        let off = (widest - right) / 2.0;
        for &v in l {
            x[v] += off;
        }
    }
    for pass in 0..PASSES {
        let down = pass % 2 == 0;
        for r in sweep_ranks(layers.len(), down) {
            let adj = if down { preds } else { succs };
            let l = &layers[r];
            let desired: Vec<f64> = l
                .iter()
                .map(|&v| {
                    let ns = &adj[v];
                    if ns.is_empty() {
                        x[v]
                    } else {
                        ns.iter().map(|&u| x[u]).sum::<f64>() / ns.len() as f64
                    }
                })
                .collect();
            let placed = isotonic(&desired, &l.iter().map(|&v| width[v]).collect::<Vec<_>>());
            for (&v, p) in l.iter().zip(placed) {
                x[v] = p;
            }
        }
    }
    x
}

/// The centres closest (least squares) to `desired` that keep the order and at least `GAP`
/// between neighbouring boxes: subtracting each box's packed offset turns the gaps into a
/// monotone constraint, which pool-adjacent-violators solves exactly.
fn isotonic(desired: &[f64], width: &[f64]) -> Vec<f64> {
    let mut offset = vec![0.0; desired.len()];
    for i in 1..desired.len() {
        offset[i] = offset[i - 1] + (width[i - 1] + width[i]) / 2.0 + GAP;
    }
    // Blocks of (sum of targets, count); each block's value is its mean.
    let mut blocks: Vec<(f64, usize)> = Vec::new();
    for (d, o) in desired.iter().zip(&offset) {
        blocks.push((d - o, 1));
        while blocks.len() > 1 {
            let (s1, n1) = blocks[blocks.len() - 1];
            let (s0, n0) = blocks[blocks.len() - 2];
            if s0 / n0 as f64 > s1 / n1 as f64 {
                blocks.pop();
                let last = blocks.len() - 1;
                blocks[last] = (s0 + s1, n0 + n1);
            } else {
                break;
            }
        }
    }
    let mut out = Vec::with_capacity(desired.len());
    for (s, n) in blocks {
        for _ in 0..n {
            out.push(s / n as f64);
        }
    }
    out.iter().zip(&offset).map(|(y, o)| y + o).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(p: &Placed, sizes: &[(f64, f64)]) -> bool {
        for i in 0..sizes.len() {
            for j in i + 1..sizes.len() {
                let (a, b) = (p.centers[i], p.centers[j]);
                let dx = (a.0 - b.0).abs() * 2.0 < sizes[i].0 + sizes[j].0;
                let dy = (a.1 - b.1).abs() * 2.0 < sizes[i].1 + sizes[j].1;
                if dx && dy {
                    return true;
                }
            }
        }
        false
    }

    #[test]
    fn boxes_never_overlap_and_edges_point_down() {
        // A diamond with a long edge and a second source.
        let sizes = vec![(60.0, 30.0), (90.0, 30.0), (40.0, 30.0), (70.0, 30.0), (50.0, 30.0), (80.0, 30.0)];
        let edges = vec![(0, 1), (0, 2), (1, 3), (2, 3), (0, 5), (4, 5), (3, 5)];
        let p = layered(&sizes, &edges, (10.0, 10.0));
        assert!(!overlaps(&p, &sizes));
        for (route, &(a, b)) in p.routes.iter().zip(&edges) {
            assert!(p.centers[a].1 < p.centers[b].1, "edge {a}->{b} goes up");
            assert!(route.windows(2).all(|w| w[0].1 < w[1].1), "{route:?}");
        }
        // The long edge 0 -> 5 passes through two dummy points.
        assert_eq!(p.routes[4].len(), 4);
        for (i, c) in p.centers.iter().enumerate() {
            assert!(c.0 - sizes[i].0 / 2.0 >= 10.0 - 1e-9 && c.0 + sizes[i].0 / 2.0 <= p.width - 10.0 + 1e-9);
        }
    }

    #[test]
    fn the_isotonic_placement_keeps_gaps_and_centres_a_lone_child() {
        let placed = isotonic(&[50.0, 50.0, 50.0], &[20.0, 20.0, 20.0]);
        assert!((placed[1] - 50.0).abs() < 1e-9, "{placed:?}");
        assert!((placed[1] - placed[0] - (20.0 + GAP)).abs() < 1e-9);
        let free = isotonic(&[0.0, 500.0], &[20.0, 20.0]);
        assert_eq!(free, vec![0.0, 500.0]);
    }

    #[test]
    fn sweeps_remove_a_removable_crossing() {
        // 0 -> 3 and 1 -> 2 cross in the initial order; swapping rank 1 removes it.
        let sizes = vec![(20.0, 20.0); 4];
        let edges = vec![(0, 3), (1, 2)];
        let p = layered(&sizes, &edges, (0.0, 0.0));
        assert_eq!(p.centers[0].0 < p.centers[1].0, p.centers[3].0 < p.centers[2].0);
    }
}
