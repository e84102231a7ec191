//! Alg. 4 (UberShuffle's carpool): fill short columns of a set's table with samples from the
//! same column of a strict superset's table.
//!
//! A sample in `Z(I', i)` is cached by all of `I' \ {i}`, hence by `I \ {i}` for any
//! `I ⊂ I'` containing `i`, so moving it keeps every packet decodable while it rides in a
//! packet that is sent anyway. Sets are visited by size (2, 3, ... n), ascending mask within a
//! size (the paper leaves the order free); for each short column of a set the supersets one
//! to `nu` sizes larger are searched, smallest first, ascending mask within a size, taking
//! samples from the end of their column. Each set's packet count (its longest column) never
//! grows and a donor's never grows, so the result never needs more packets than Alg. 2 alone.
//!
//! Supersets are enumerated by adding up to `nu` of the `n - |I|` missing nodes (at most
//! `C(n, nu)` lookups per short column) rather than by scanning every table.

use super::Node;
use super::index::{NodeSet, Table, members};

/// Runs Alg. 4 on `table` in place with search depth `nu`.
pub(crate) fn carpool(table: &mut Table, nu: usize) {
    let universe: NodeSet = table.sets.keys().fold(0, |a, &s| a | s);
    let n = 64 - universe.leading_zeros() as usize;
    for size in 2..=n {
        let sets: Vec<NodeSet> = table
            .sets
            .keys()
            .copied()
            .filter(|s| s.count_ones() as usize == size)
            .collect();
        for set in sets {
            fill(table, set, n, nu);
        }
    }
}

fn fill(table: &mut Table, set: NodeSet, n: usize, nu: usize) {
    let rows = (members(set))
        .map(|i| table.column_len(set, i))
        .max()
        .unwrap_or(0);
    for node in members(set) {
        let mut want = rows - table.column_len(set, node);
        if want == 0 {
            continue;
        }
        let outside: Vec<Node> = (0..n).filter(|&i| set >> i & 1 == 0).collect();
        'depth: for extra in 1..=nu.min(outside.len()) {
            for sup in supersets(set, &outside, extra) {
                let Some(donor) = table.sets.get_mut(&sup).and_then(|c| c.get_mut(&node)) else {
                    continue;
                };
                let take = want.min(donor.len());
                let moved = donor.split_off(donor.len() - take);
                if donor.is_empty() {
                    let cols = table.sets.get_mut(&sup).expect("donor set exists");
                    cols.remove(&node);
                    if cols.is_empty() {
                        table.sets.remove(&sup);
                    }
                }
                let col = table
                    .sets
                    .get_mut(&set)
                    .expect("set being filled exists")
                    .entry(node)
                    .or_default();
                col.extend(moved);
                want -= take;
                if want == 0 {
                    break 'depth;
                }
            }
        }
    }
}

/// `set` plus every `extra`-subset of `outside`, ascending by mask.
fn supersets(set: NodeSet, outside: &[Node], extra: usize) -> Vec<NodeSet> {
    let mut out = Vec::new();
    let mut pick: Vec<usize> = (0..extra).collect();
    loop {
        out.push(pick.iter().fold(set, |m, &k| m | 1 << outside[k]));
        // Next combination of `extra` indices into `outside`, lexicographic.
        let Some(pos) = (0..extra)
            .rev()
            .find(|&p| pick[p] < outside.len() - extra + p)
        else {
            break;
        };
        pick[pos] += 1;
        for p in pos + 1..extra {
            pick[p] = pick[p - 1] + 1;
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::supersets;

    #[test]
    fn supersets_add_every_combination_once() {
        let s = supersets(0b0001, &[1, 2, 3], 2);
        assert_eq!(s, vec![0b0111, 0b1011, 0b1101]);
        assert_eq!(
            supersets(0b0001, &[1, 2, 3], 1),
            vec![0b0011, 0b0101, 0b1001]
        );
        assert_eq!(supersets(0, &[0, 1, 2, 3, 4], 3).len(), 10);
    }
}
