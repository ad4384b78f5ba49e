//! The text front end: the checkpoint's `tokenizer.json`, and splitting long text into
//! segments that fit the model's context.
//!
//! Splitting rule: text is cut after sentence ends (`.`, `!`, `?`, `;` or a line break,
//! followed by white space); sentences are packed in order into segments of at most
//! `budget` tokens; a sentence longer than the budget is cut between words; a single word
//! longer than the budget is refused.

use tokenizers::Tokenizer;

use crate::checkpoint::{Checkpoint, TOKENIZER_FILE};
use crate::error::EngineError;

/// The checkpoint's tokenizer.
pub struct TextFrontEnd {
    tokenizer: Tokenizer,
    vocab: usize,
}

/// Text tokens one segment may hold: the context (`max_positions`) less the voice prefix,
/// `audio_bos` and up to `max_audio_tokens` audio tokens; `None` when nothing is left.
pub fn text_budget(max_positions: usize, prefix_len: usize, max_audio_tokens: usize) -> Option<usize> {
    let reserved = prefix_len.checked_add(1)?.checked_add(max_audio_tokens)?;
    max_positions.checked_sub(reserved).filter(|&budget| budget > 0)
}

impl TextFrontEnd {
    /// Loads `tokenizer.json` and checks its ids fit the text vocabulary.
    pub fn load(checkpoint: &Checkpoint) -> Result<TextFrontEnd, EngineError> {
        let path = checkpoint.dir.join(TOKENIZER_FILE);
        let tokenizer =
            Tokenizer::from_file(&path).map_err(|e| EngineError::Unsupported(format!("{TOKENIZER_FILE}: {e}")))?;
        let vocab = checkpoint.config.text_vocab_size;
        let size = tokenizer.get_vocab_size(true);
        if size > vocab {
            return Err(EngineError::Unsupported(format!(
                "{TOKENIZER_FILE} has {size} tokens, more than text_vocab_size {vocab}"
            )));
        }
        Ok(TextFrontEnd { tokenizer, vocab })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
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
    pub fn segments(&self, text: &str, budget: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        if text.trim().is_empty() {
            return Err(EngineError::Input("the text is empty".into()));
        }
        let mut packer = Packer {
            front: self,
            budget,
            segments: Vec::new(),
            current: String::new(),
            current_ids: Vec::new(),
        };
        for sentence in sentences(text) {
            if packer.extend(&sentence)? {
                continue;
            }
            packer.close();
            if packer.extend(&sentence)? {
                continue;
            }
            for word in sentence.split_inclusive(char::is_whitespace) {
                if packer.extend(word)? {
                    continue;
                }
                packer.close();
                if !packer.extend(word)? {
                    return Err(EngineError::Input(format!(
                        "the word {:?} alone needs more than the {budget} tokens that fit the context",
                        word.trim()
                    )));
                }
            }
        }
        packer.close();
        Ok(packer.segments)
    }
}

/// Packs pieces of text in order into segments of at most `budget` tokens; each candidate
/// text is tokenized once, when tried.
struct Packer<'a> {
    front: &'a TextFrontEnd,
    budget: usize,
    segments: Vec<Vec<u32>>,
    /// The segment being filled, and its tokens.
    current: String,
    current_ids: Vec<u32>,
}

impl Packer<'_> {
    /// Appends `piece` to the segment being filled if the result fits the budget; says
    /// whether it did.
    fn extend(&mut self, piece: &str) -> Result<bool, EngineError> {
        let candidate = format!("{}{piece}", self.current);
        let ids = self.front.encode(candidate.trim())?;
        if ids.len() > self.budget {
            return Ok(false);
        }
        (self.current, self.current_ids) = (candidate, ids);
        Ok(true)
    }

    /// Ends the segment being filled (one of white space only is dropped).
    fn close(&mut self) {
        if !self.current.trim().is_empty() {
            self.segments.push(std::mem::take(&mut self.current_ids));
        }
        self.current.clear();
        self.current_ids.clear();
    }
}

/// Sentences with their trailing white space, in order.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        current.push(c);
        let ends = matches!(c, '.' | '!' | '?' | ';' | '\n');
        if ends && chars.peek().is_none_or(|n| n.is_whitespace()) {
            while let Some(&n) = chars.peek() {
                if !n.is_whitespace() {
                    break;
                }
                current.push(n);
                chars.next();
            }
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::sentences;

    #[test]
    fn sentences_keep_every_character_in_order() {
        let text = "Hello there. How are you?\nFine; thanks. 3.14 is pi";
        let parts = sentences(text);
        assert_eq!(parts.concat(), text);
        assert_eq!(parts.len(), 5);
        assert_eq!(parts[4], "3.14 is pi");
    }
}
