//! Splitting text at special tokens (control and user-defined) the way llama.cpp does, in time
//! linear in the text: llama.cpp takes the specials longest first and splits every remaining
//! raw fragment at each one's leftmost non-overlapping occurrences. Here one Aho-Corasick pass
//! finds every occurrence of every special, and occurrences are then accepted in that same
//! order (priority, then position) when they lie in text no earlier special has taken.

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use std::collections::BTreeMap;

/// A vocabulary index (the tokenizer's `TokenId`).
type TokenId = u32;

/// The special tokens of a vocabulary, in partition order, and an automaton over their texts.
#[derive(Debug)]
pub(crate) struct Specials {
    /// Pattern `i` of the automaton is `ids[i]`, priority `i` (0 first).
    ids: Vec<TokenId>,
    /// Whether pattern `i` is split out only when control text is parsed.
    control: Vec<bool>,
    automaton: Option<AhoCorasick>,
}

impl Specials {
    /// `specials`: (id, text, control-only) in partition order; empty texts are ignored.
    pub fn new<'a>(specials: impl IntoIterator<Item = (TokenId, &'a str, bool)>) -> Self {
        let (mut ids, mut control, mut texts) = (Vec::new(), Vec::new(), Vec::new());
        for (id, text, ctl) in specials {
            if !text.is_empty() {
                ids.push(id);
                control.push(ctl);
                texts.push(text);
            }
        }
        // A contiguous NFA builds in time linear in the texts' total length; the automatic
        // choice may build a DFA, whose size grows with length times distinct bytes (a hostile
        // file's 4 MB special token took forever).
        let automaton = (!texts.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .kind(Some(AhoCorasickKind::ContiguousNFA))
                .build(&texts)
                .expect("special token texts form a valid automaton")
        });
        Self {
            ids,
            control,
            automaton,
        }
    }

    /// `text` as non-empty raw fragments (`Err`) and special token ids (`Ok`), in order.
    /// Control tokens count only when `parse_control`.
    pub fn partition<'t>(
        &self,
        text: &'t str,
        parse_control: bool,
    ) -> Vec<Result<TokenId, &'t str>> {
        let Some(ac) = self.automaton.as_ref().filter(|_| !text.is_empty()) else {
            return if text.is_empty() {
                vec![]
            } else {
                vec![Err(text)]
            };
        };
        // (priority, start, end) of every occurrence, overlapping ones included.
        let mut found: Vec<(u32, usize, usize)> = ac
            .find_overlapping_iter(text)
            .map(|m| (m.pattern().as_u32(), m.start(), m.end()))
            .filter(|&(p, _, _)| parse_control || !self.control[p as usize])
            .collect();
        found.sort_unstable();
        // Accepted spans, start -> (end, priority).
        let mut taken: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        let mut last: Option<(u32, usize)> = None; // the current special's last accepted end
        for (p, start, end) in found {
            let resume = match last {
                Some((lp, e)) if lp == p => e,
                _ => 0,
            };
            if start < resume || overlaps(&taken, start, end) {
                continue;
            }
            taken.insert(start, (end, p));
            last = Some((p, end));
        }
        let mut out = Vec::with_capacity(2 * taken.len() + 1);
        let mut pos = 0;
        for (&start, &(end, p)) in &taken {
            if start > pos {
                out.push(Err(&text[pos..start]));
            }
            out.push(Ok(self.ids[p as usize]));
            pos = end;
        }
        if pos < text.len() {
            out.push(Err(&text[pos..]));
        }
        out
    }
}

/// Whether `start..end` overlaps a span of `taken` (which never overlap each other).
fn overlaps(taken: &BTreeMap<usize, (usize, u32)>, start: usize, end: usize) -> bool {
    let before = taken.range(..end).next_back();
    matches!(before, Some((_, &(e, _))) if e > start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// llama.cpp's procedure, as written: each special in turn splits every raw fragment.
    fn sequential<'t>(
        specials: &[(TokenId, &str, bool)],
        text: &'t str,
        parse_control: bool,
    ) -> Vec<Result<TokenId, &'t str>> {
        let mut out: Vec<Result<TokenId, &'t str>> = vec![Err(text)];
        out.retain(|f| f != &Err(""));
        for &(id, needle, ctl) in specials {
            if needle.is_empty() || (ctl && !parse_control) {
                continue;
            }
            let mut next = Vec::new();
            for frag in out {
                let Err(mut s) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(p) = s.find(needle) {
                    if p > 0 {
                        next.push(Err(&s[..p]));
                    }
                    next.push(Ok(id));
                    s = &s[p + needle.len()..];
                }
                if !s.is_empty() {
                    next.push(Err(s));
                }
            }
            out = next;
        }
        out
    }

    #[test]
    fn longest_first_then_leftmost() {
        let sp = [
            (1, "<|im_start|>", true),
            (2, "\n\n", false),
            (3, "\n", false),
        ];
        let s = Specials::new(sp);
        let text = "<|im_start|>user\n\n\nhi";
        assert_eq!(
            s.partition(text, true),
            vec![Ok(1), Err("user"), Ok(2), Ok(3), Err("hi")]
        );
        assert_eq!(
            s.partition(text, false),
            vec![Err("<|im_start|>user"), Ok(2), Ok(3), Err("hi")]
        );
        assert_eq!(s.partition("", true), vec![]);
    }

    /// A hostile vocabulary's 4 MB special token of many distinct bytes: built and matched in
    /// time linear in its length (a DFA over it took minutes at 16 KB and never ended at 4 MB).
    #[test]
    fn a_huge_special_token_builds_in_linear_time() {
        let long: String = (0..4 << 20)
            .map(|i: u32| char::from(b'!' + (i.wrapping_mul(2654435761) >> 26) as u8))
            .collect();
        let t0 = std::time::Instant::now();
        let s = Specials::new([(7, long.as_str(), false), (8, "<|x|>", true)]);
        let text = format!("a{long}b<|x|>");
        assert_eq!(
            s.partition(&text, true),
            vec![Err("a"), Ok(7), Err("b"), Ok(8)]
        );
        assert!(t0.elapsed().as_secs() < 60, "{:?}", t0.elapsed());
    }

    proptest! {
        /// Equal to the sequential procedure for any text over a small alphabet and any set of
        /// specials (overlapping, nested, repeated, control or not).
        #[test]
        fn equals_the_sequential_procedure(
            words in proptest::collection::vec(("[ab\n]{1,4}", any::<bool>()), 1..8),
            text in "[ab\n c]{0,40}",
            parse in any::<bool>(),
        ) {
            let mut sp: Vec<(TokenId, &str, bool)> = words
                .iter()
                .enumerate()
                .map(|(i, (w, c))| (i as TokenId, w.as_str(), *c))
                .collect();
            sp.sort_by_key(|&(_, t, _)| std::cmp::Reverse(t.len()));
            let fast = Specials::new(sp.iter().copied());
            prop_assert_eq!(fast.partition(&text, parse), sequential(&sp, &text, parse));
        }
    }
}
