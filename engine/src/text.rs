//! The text front end: the checkpoint's `tokenizer.json`, and splitting long text into
//! segments that fit the model's context.
//!
//! Splitting rule: text is cut after sentence ends (`.`, `!`, `?` or `;` followed by white
//! space, and every line break); the first sentence is a segment of its own (its audio
//! starts however long the text), the others are packed in order into segments of at most
//! `budget` tokens; a sentence longer than the budget is cut between words; a single word
//! longer than the budget is refused.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;
use tokenizers::Tokenizer;

use crate::error::EngineError;
use drama_checkpoint::Checkpoint;

/// The checkpoint's tokenizer, and the context its segments must fit.
pub struct TextFrontEnd {
    tokenizer: Arc<Tokenizer>,
    vocab: usize,
    /// Positions of the model's context.
    max_positions: usize,
    /// Positions the voice prefix takes.
    prefix_len: usize,
}

impl TextFrontEnd {
    /// The front end of `checkpoint`'s tokenizer (parsed and checked when it was opened).
    pub fn new(checkpoint: &Checkpoint) -> TextFrontEnd {
        TextFrontEnd {
            tokenizer: checkpoint.tokenizer.clone(),
            vocab: checkpoint.config.text_vocab_size,
            max_positions: checkpoint.config.max_position_embeddings,
            prefix_len: checkpoint.config.speech.voice_prefix_len,
        }
    }

    /// Text tokens one segment may hold beside up to `max_audio_tokens` tokens of speech:
    /// the context less the voice prefix, `audio_bos` and the speech; `None` when nothing
    /// is left.
    pub fn budget(&self, max_audio_tokens: usize) -> Option<usize> {
        let reserved = self.prefix_len.checked_add(1)?.checked_add(max_audio_tokens)?;
        self.max_positions.checked_sub(reserved).filter(|&budget| budget > 0)
    }

    /// `text` cut into segments that each fit the context beside up to `max_audio_tokens`
    /// tokens of speech ([`TextFrontEnd::budget`], then [`TextFrontEnd::segments`]).
    pub fn segments_for(&self, text: &str, max_audio_tokens: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        let budget = self.budget(max_audio_tokens).ok_or(EngineError::NoRoomForText {
            max_audio_tokens,
            positions: self.max_positions,
            prefix_len: self.prefix_len,
        })?;
        self.segments(text, budget)
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        // Without offsets: the ids are the same and come sooner.
        let encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| EngineError::Input(format!("text could not be tokenized: {e}")))?;
        let ids = encoding.get_ids().to_vec();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(EngineError::Input(format!(
                "token id {id} is outside the text vocabulary"
            )));
        }
        Ok(ids)
    }

    /// Splits `text` into segments of at most `budget` tokens each (see the module rule);
    /// returns the token ids of every segment. Empty text is refused.
    ///
    /// The packing is greedy. Each segment's run of pieces is found by a search that starts
    /// where the pieces' own token counts say the budget ends and gallops from there, so a
    /// segment of sentences is usually tokenized twice (the run, and the run with one more
    /// piece), and a segment of `n` words about `2 log n` times rather than `n` (a
    /// 20 000-character sentence cut between words would otherwise tokenize its growing
    /// segment once per word). The sentences are measured side by side on the host's
    /// threads.
    pub fn segments(&self, text: &str, budget: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        if text.trim().is_empty() {
            return Err(EngineError::Input("the text is empty".into()));
        }
        let mut segments = Vec::new();
        let mut groups = self.groups(text, budget)?;
        // The first sentence is a segment of its own, so its audio starts after its own
        // prefill however much text follows it.
        if let Some(first) = groups.first_mut()
            && let Some(at) = first
                .iter()
                .position(|piece| !text[piece.range.clone()].trim().is_empty())
            && at + 1 < first.len()
        {
            let rest = first.split_off(at + 1);
            groups.insert(1, rest);
        }
        for group in groups {
            let mut start = 0;
            while start < group.len() {
                let (taken, ids) = self.longest_run(text, &group[start..], budget)?;
                let run = &text[group[start].range.start..group[start + taken - 1].range.end];
                if !run.trim().is_empty() {
                    segments.push(ids);
                }
                start += taken;
            }
        }
        Ok(segments)
    }

    /// The pieces of `text` to pack, in order, in groups no segment spans: sentences,
    /// except that a sentence over the budget is cut into words that start a new group
    /// (the sentences after it may join its last segment).
    fn groups(&self, text: &str, budget: usize) -> Result<Vec<Vec<Piece>>, EngineError> {
        let sentences = sentences(text);
        let counts = sentences
            .par_iter()
            .map(|sentence| self.encode(text[sentence.clone()].trim()).map(|ids| ids.len()))
            .collect::<Result<Vec<usize>, EngineError>>()?;
        let mut groups = vec![Vec::new()];
        for (sentence, tokens) in sentences.into_iter().zip(counts) {
            if tokens <= budget {
                let piece = Piece {
                    range: sentence,
                    tokens: Some(tokens),
                };
                groups.last_mut().expect("one group at least").push(piece);
                continue;
            }
            let mut words = Vec::new();
            let mut at = sentence.start;
            for word in text[sentence].split_inclusive(char::is_whitespace) {
                words.push(Piece {
                    range: at..at + word.len(),
                    tokens: None,
                });
                at += word.len();
            }
            groups.push(words);
        }
        Ok(groups)
    }

    /// How many of `pieces`, from the first, make the longest run that fits the budget, and
    /// that run's tokens; an error naming the first piece when it alone does not fit.
    fn longest_run(&self, text: &str, pieces: &[Piece], budget: usize) -> Result<(usize, Vec<u32>), EngineError> {
        let encode_run = |count: usize| self.encode(text[pieces[0].range.start..pieces[count - 1].range.end].trim());
        // A sentence is known to fit; a word is encoded alone first.
        let first = match pieces[0].tokens {
            Some(_) => None,
            None => Some(encode_run(1)?),
        };
        if first.as_ref().is_some_and(|ids| ids.len() > budget) {
            return Err(EngineError::Input(format!(
                "the word {:?} alone needs more than the {budget} tokens that fit the context",
                text[pieces[0].range.clone()].trim()
            )));
        }
        // Where the pieces' own counts put the end (a run of words, whose counts are not
        // known, starts from one piece).
        let mut summed = 0;
        let estimate = pieces
            .iter()
            .take_while(|piece| {
                summed += piece.tokens.unwrap_or(budget + 1);
                summed <= budget
            })
            .count()
            .max(1);
        let (mut fits, mut fitting_ids) = (1, first);
        let mut too_long = None;
        if estimate > 1 {
            let ids = encode_run(estimate)?;
            if ids.len() <= budget {
                (fits, fitting_ids) = (estimate, Some(ids));
            } else {
                too_long = Some(estimate);
            }
        }
        // Gallop up from the longest run known to fit until one does not or every piece is
        // taken...
        let mut step = 1;
        while too_long.is_none() && fits < pieces.len() {
            let count = (fits + step).min(pieces.len());
            let ids = encode_run(count)?;
            if ids.len() <= budget {
                (fits, fitting_ids) = (count, Some(ids));
                step *= 2;
            } else {
                too_long = Some(count);
            }
        }
        // ...then bisect between the longest run known to fit and the shortest known not to.
        if let Some(mut too_long) = too_long {
            while too_long - fits > 1 {
                let count = fits + (too_long - fits) / 2;
                let ids = encode_run(count)?;
                if ids.len() <= budget {
                    (fits, fitting_ids) = (count, Some(ids));
                } else {
                    too_long = count;
                }
            }
        }
        let ids = match fitting_ids {
            Some(ids) => ids,
            None => encode_run(fits)?,
        };
        Ok((fits, ids))
    }
}

/// A piece of text to pack: its byte range and, for a sentence, the token count of its
/// trimmed text (which estimates where a run of them reaches the budget).
struct Piece {
    range: Range<usize>,
    tokens: Option<usize>,
}

/// Sentences with their trailing white space, as byte ranges of `text` in order.
fn sentences(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        let ends = matches!(c, '.' | '!' | '?' | ';') && chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
        if ends || c == '\n' {
            while chars.next_if(|&(_, n)| n.is_whitespace()).is_some() {}
            let end = chars.peek().map_or(text.len(), |&(at, _)| at);
            out.push(start..end);
            start = end;
        }
    }
    if start < text.len() {
        out.push(start..text.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::sentences;

    #[test]
    fn sentences_keep_every_character_in_order() {
        let text = "Hello there. How are you?\nFine; thanks. 3.14 is pi";
        let parts: Vec<&str> = sentences(text).into_iter().map(|range| &text[range]).collect();
        assert_eq!(parts.concat(), text);
        assert_eq!(parts.len(), 5);
        assert_eq!(parts[4], "3.14 is pi");
    }
}
