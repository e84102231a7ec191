//! The tree the job view's rows go up and its table comes down: each host's
//! first rank (its *leader*) is the parent of the host's other ranks, and the leaders form
//! a [`FAN_IN`]-ary tree in order of their hosts' first ranks, rank 0 at its root. So a rank
//! exchanges with its parent and at most `FAN_IN` leaders plus its own host's ranks, never
//! with every rank, and a row reaches rank 0 in about log_FAN_IN(hosts) + 1 hops. Every
//! rank computes the same tree from the host of every rank (`Comm::hosts`), with no message.

use crate::plan::Rank;

/// Leaders under each leader.
pub(crate) const FAN_IN: usize = 8;

/// One rank's place in the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Place {
    /// `None` for rank 0.
    pub parent: Option<Rank>,
    /// Its host's other ranks (if it leads the host), then the leaders under it.
    pub children: Vec<Rank>,
    /// Hops from the deepest rank of the job to rank 0.
    pub depth: usize,
}

/// `me`'s place in the tree of a job whose rank `r` runs on host `hosts[r]`.
pub(crate) fn place(hosts: &[u32], me: Rank) -> Place {
    // Leaders in order of their first rank, and each host's position among them.
    let mut leaders: Vec<Rank> = Vec::new();
    let mut position = std::collections::HashMap::new();
    for (r, &h) in hosts.iter().enumerate() {
        position.entry(h).or_insert_with(|| {
            leaders.push(r as Rank);
            leaders.len() - 1
        });
    }
    let mine = hosts.get(me as usize).map_or(0, |h| position[h]);
    let leads = leaders.get(mine) == Some(&me);
    let parent = match (leads, mine) {
        (false, _) => Some(leaders[mine]),
        (true, 0) => None,
        (true, i) => Some(leaders[(i - 1) / FAN_IN]),
    };
    let mut children = Vec::new();
    if leads {
        let host = hosts[me as usize];
        let own = (0..hosts.len()).filter(|&r| hosts[r] == host && r != me as usize);
        children.extend(own.map(|r| r as Rank));
        let below = (FAN_IN * mine + 1..=FAN_IN * mine + FAN_IN).filter_map(|i| leaders.get(i));
        children.extend(below);
    }
    let mut depth = usize::from(leaders.len() < hosts.len());
    let mut i = leaders.len().saturating_sub(1);
    while i > 0 {
        (i, depth) = ((i - 1) / FAN_IN, depth + 1);
    }
    Place {
        parent,
        children,
        depth,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Following parents from any rank reaches rank 0 within `depth` hops, and every rank is
    /// the child of exactly its parent.
    #[test]
    fn every_rank_reaches_rank_0_and_is_its_parents_child() {
        for (ranks, per_host) in [(1, 1), (3, 3), (64, 1), (100, 4), (4096, 8), (1000, 7)] {
            let hosts: Vec<u32> = (0..ranks).map(|r| r / per_host).collect();
            let places: Vec<Place> = (0..ranks).map(|r| place(&hosts, r)).collect();
            let depth = places[0].depth;
            for r in 0..ranks {
                let p = &places[r as usize];
                assert_eq!(p.depth, depth);
                assert!(p.children.len() < FAN_IN + per_host as usize);
                let (mut at, mut hops) = (r, 0);
                while let Some(up) = places[at as usize].parent {
                    assert!(places[up as usize].children.contains(&at), "{r}");
                    (at, hops) = (up, hops + 1);
                }
                assert!(at == 0 && hops <= depth, "rank {r}: {hops} hops");
            }
            let children: usize = places.iter().map(|p| p.children.len()).sum();
            assert_eq!(children, ranks as usize - 1);
        }
        let hosts: Vec<u32> = (0..4096).map(|r| r / 8).collect();
        assert_eq!(place(&hosts, 0).depth, 4);
        assert_eq!(place(&hosts, 0).children.len(), 7 + FAN_IN);
    }
}
