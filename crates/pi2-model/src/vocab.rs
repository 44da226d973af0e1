//! A vocabulary's token texts in one buffer, found by text through a table of ids: no second
//! copy of the texts and no allocation per token (about 14 bytes per token beyond the texts,
//! where a `Vec<String>` plus a `HashMap<String, id>` take about 100; 151,936 tokens: 3.9 MB
//! instead of about 19). Where memory is the budget, that is room for neurons.

use crate::{ModelError, TokenId};

const EMPTY: u32 = u32::MAX;

pub(crate) struct Vocab {
    text: String,
    /// End of token `i`'s text in `text` (its start is the previous end).
    ends: Vec<u32>,
    /// Open addressing by FNV-1a hash of the text, linear probing: token ids, `EMPTY` where free.
    slots: Vec<u32>,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocab({} tokens)", self.len())
    }
}

fn hash(s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in s.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Vocab {
    /// From the texts in id order; a text that repeats keeps its first id (lookups find it).
    pub(crate) fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Self, ModelError> {
        let mut text = String::new();
        let mut ends = Vec::new();
        for t in texts {
            text.push_str(t);
            let end = u32::try_from(text.len())
                .map_err(|_| ModelError::Tokenizer("the vocabulary's texts exceed 4 GiB".into()))?;
            ends.push(end);
        }
        if ends.len() >= EMPTY as usize {
            return Err(ModelError::Tokenizer("too many tokens".into()));
        }
        let slots = vec![EMPTY; (2 * ends.len()).next_power_of_two().max(2)];
        let mut v = Vocab { text, ends, slots };
        let mask = v.slots.len() - 1;
        for id in 0..v.ends.len() as u32 {
            let t = v.get(id).unwrap_or_default();
            let mut i = hash(t) as usize & mask;
            loop {
                match v.slots[i] {
                    EMPTY => {
                        v.slots[i] = id;
                        break;
                    }
                    other if v.get(other) == Some(t) => break, // a repeat: the first id stays
                    _ => i = (i + 1) & mask,
                }
            }
        }
        Ok(v)
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn get(&self, id: TokenId) -> Option<&str> {
        let i = id as usize;
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text.get(start..end)
    }

    /// The id of the token whose text is exactly `text`.
    pub(crate) fn id(&self, text: &str) -> Option<TokenId> {
        let mask = self.slots.len() - 1;
        let mut i = hash(text) as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => return None,
                id if self.get(id) == Some(text) => return Some(id),
                _ => i = (i + 1) & mask,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn finds_what_a_map_finds(texts in proptest::collection::vec("[a-c\u{2581}]{0,4}", 0..200),
                                  probes in proptest::collection::vec("[a-d]{0,4}", 0..50)) {
            let v = Vocab::new(texts.iter().map(String::as_str)).unwrap();
            let mut map = HashMap::new();
            for (i, t) in texts.iter().enumerate() {
                map.entry(t.as_str()).or_insert(i as TokenId);
                prop_assert_eq!(v.get(i as TokenId), Some(t.as_str()));
            }
            prop_assert_eq!(v.len(), texts.len());
            prop_assert_eq!(v.get(texts.len() as TokenId), None);
            for p in texts.iter().chain(&probes) {
                prop_assert_eq!(v.id(p), map.get(p.as_str()).copied());
            }
        }
    }
}
