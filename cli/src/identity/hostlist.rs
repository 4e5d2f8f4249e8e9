//! Slurm's hostlist notation (`SLURM_JOB_NODELIST`, `SLURM_STEP_NODELIST`):
//! `tux[1-3,7],gpu-[01-02]-ib` expands to `tux1 tux2 tux3 tux7 gpu-01-ib
//! gpu-02-ib`, in that order.
//!
//! Rules (as Slurm's own `scontrol show hostnames`):
//! 1. Items are separated by commas outside brackets; a bracket holds
//!    numbers and ranges `LO-HI` separated by commas.
//! 2. A range's numbers are as wide as `LO` is written (`[01-10]` gives
//!    `01 … 10`, `[1-10]` gives `1 … 10`).
//! 3. Several brackets in one item expand as their product, the last
//!    varying fastest (`r[1-2]n[1-2]`: `r1n1 r1n2 r2n1 r2n2`).
//!
//! The text comes from the environment: the expansion is bounded by
//! [`MAX_HOSTS`] and every malformed list is an error that says where.

use super::IdentityError;

/// The most names one list may expand to.
pub const MAX_HOSTS: usize = 65_536;

/// The host names `list` denotes, in order.
pub fn expand(list: &str) -> Result<Vec<String>, IdentityError> {
    let bad = |why: String| IdentityError::Hostlist {
        list: list.chars().take(200).collect(),
        why,
    };
    let mut hosts = Vec::new();
    for item in split_top(list).map_err(bad)? {
        if item.is_empty() {
            return Err(bad("an empty name".into()));
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (literal, after) = match rest.find('[') {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            if literal.contains(']') {
                return Err(bad(format!("`]` without `[` in `{item}`")));
            }
            names.iter_mut().for_each(|n| n.push_str(literal));
            let Some(after) = after else { break };
            let close = after
                .find(']')
                .ok_or_else(|| bad(format!("`[` without `]` in `{item}`")))?;
            let numbers = numbers(&after[..close]).map_err(|e| bad(format!("`{item}`: {e}")))?;
            let product = names.len().saturating_mul(numbers.len());
            if hosts.len().saturating_add(product) > MAX_HOSTS {
                return Err(bad(format!("more than {MAX_HOSTS} hosts")));
            }
            names = names
                .iter()
                .flat_map(|n| numbers.iter().map(move |x| format!("{n}{x}")))
                .collect();
            rest = &after[close + 1..];
        }
        hosts.extend(names);
    }
    if hosts.is_empty() {
        return Err(bad("no host".into()));
    }
    Ok(hosts)
}

/// Items at commas outside brackets (rule 1).
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("nested `[`".into()),
            ']' if depth == 1 => depth = 0,
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// The numbers inside one bracket, written out (rule 2).
fn numbers(inside: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in inside.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| -> Result<u64, String> {
            if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{part}` is not a number or LO-HI"));
            }
            s.parse().map_err(|_| format!("`{s}` is out of range"))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if a > b {
            return Err(format!("`{part}` runs backwards"));
        }
        if (b - a) as usize >= MAX_HOSTS.saturating_sub(out.len()) {
            return Err(format!("more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|x| format!("{x:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap()
    }

    #[test]
    fn ranges_lists_and_plain_names_expand_in_order() {
        assert_eq!(names("n1"), ["n1"]);
        assert_eq!(
            names("tux[1-3,7],gpu-[01-02]-ib"),
            ["tux1", "tux2", "tux3", "tux7", "gpu-01-ib", "gpu-02-ib"]
        );
        assert_eq!(names("a, b ,c"), ["a", "b", "c"]);
        assert_eq!(names("node[8-11]").len(), 4);
        assert_eq!(names("node[8-11]")[2], "node10");
    }

    #[test]
    fn a_range_keeps_the_width_its_low_bound_is_written_in() {
        assert_eq!(names("g[08-10]"), ["g08", "g09", "g10"]);
        assert_eq!(names("g[001-002]"), ["g001", "g002"]);
        assert_eq!(names("g[9-10]"), ["g9", "g10"]);
    }

    #[test]
    fn several_brackets_expand_as_a_product_last_fastest() {
        assert_eq!(names("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        for (list, why) in [
            ("n[1-3", "without `]`"),
            ("n1-3]", "without `[`"),
            ("n[[1]]", "nested"),
            ("n[3-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[]", "not a number"),
            ("n[1-99999999999999999999]", "not a number"),
            ("a,,b", "empty name"),
            ("", "empty name"),
            ("n[0-9999999]", "more than"),
            ("a[0-999]b[0-999]", "more than"),
        ] {
            let e = expand(list).unwrap_err().to_string();
            assert!(e.contains(why), "{list}: {e}");
        }
    }
}
