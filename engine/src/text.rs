//! The text front end: the checkpoint's `tokenizer.json`, and splitting long text into
//! segments that fit the model's context.
//!
//! Splitting rule: text is cut after sentence ends (`.`, `!`, `?` or `;` followed by white
//! space, the full-width `。`, `！`, `？` and `；` whatever follows, and every line break);
//! the first sentence is a segment of its own (its audio starts however long the text), the
//! others are packed in order into segments of at most `budget` tokens; a sentence longer
//! than the budget is cut between words; a word longer than the budget is refused, unless
//! it is written in a script without spaces (Chinese, Japanese), whose words run together:
//! it is cut after its pause marks (、，：,), and a clause still too long between its
//! characters.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;
use tokenizers::Tokenizer;
use unicode_segmentation::UnicodeSegmentation;

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
        self.segments(text, self.budget_for(max_audio_tokens)?)
    }

    /// [`TextFrontEnd::budget`], or the error that names why there is none.
    pub fn budget_for(&self, max_audio_tokens: usize) -> Result<usize, EngineError> {
        self.budget(max_audio_tokens).ok_or(EngineError::NoRoomForText {
            max_audio_tokens,
            positions: self.max_positions,
            prefix_len: self.prefix_len,
        })
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
    /// The packing is greedy. The sentences are measured side by side on the host's
    /// threads, and their counts predict the segments' runs; as many predicted runs as the
    /// host has threads are checked side by side (the run fits and the run with one more
    /// piece does not: two tokenizations each), so text whose counts add up takes about one
    /// segment's time per round, not every segment's in turn. Where a prediction fails, its
    /// run is searched for from what the check found; a run of words from where the counts
    /// say the budget ends, galloping from there: a segment of `n` words takes about
    /// `2 log n` tokenizations rather than `n` (a 20 000-character sentence cut between
    /// words would otherwise tokenize its growing segment once per word).
    pub fn segments(&self, text: &str, budget: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        self.packed(text, budget, true)
    }

    /// The first segment of `text` cut on its own, and the byte offset where the text after
    /// it starts, when the first sentence is a segment of its own (it fits the budget) and
    /// text that is not all white space follows it; `None` otherwise. The first segment
    /// and [`TextFrontEnd::segments_after`] of the rest are [`TextFrontEnd::segments`] of the
    /// whole, so a caller can start speaking the first while the rest is being cut.
    pub fn first_segment(&self, text: &str, budget: usize) -> Result<Option<(Vec<u32>, usize)>, EngineError> {
        let Some(first) = sentences(text).find(|sentence| !text[sentence.clone()].trim().is_empty()) else {
            return Ok(None);
        };
        if text[first.end..].trim().is_empty() {
            return Ok(None);
        }
        let ids = self.encode(text[first.clone()].trim())?;
        Ok((ids.len() <= budget).then_some((ids, first.end)))
    }

    /// The segments of the text after a first segment cut by
    /// [`TextFrontEnd::first_segment`]: packed as [`TextFrontEnd::segments`] packs them,
    /// with no sentence of their own first.
    pub fn segments_after(&self, text: &str, budget: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        self.packed(text, budget, false)
    }

    /// The segments of `text`; with `first_alone`, the first sentence is a segment of its
    /// own, so its audio starts after its own prefill however much text follows it.
    fn packed(&self, text: &str, budget: usize, first_alone: bool) -> Result<Vec<Vec<u32>>, EngineError> {
        if text.trim().is_empty() {
            return Err(EngineError::Input("the text is empty".into()));
        }
        let mut segments = Vec::new();
        let mut groups = self.groups(text, budget)?;
        if first_alone
            && let Some(first) = groups.first_mut()
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
                // The runs the counts predict from here, checked side by side; from the first
                // that is not the longest run that fits, that run is searched for, and the
                // prediction starts again after it. A word is searched for at once.
                let predicted = predicted_runs(&group[start..], budget, rayon::current_num_threads());
                let checked = predicted
                    .par_iter()
                    .map(|&(first, count)| self.checked_run(text, &group[start + first..], count, budget))
                    .collect::<Result<Vec<Bounds>, EngineError>>()?;
                let mut runs = Vec::new();
                let mut from = start;
                for (&(_, count), bounds) in predicted.iter().zip(checked) {
                    let (taken, ids) = self.search(text, &group[from..], budget, bounds)?;
                    runs.push((from..from + taken, ids));
                    from += taken;
                    if taken != count {
                        break;
                    }
                }
                if predicted.is_empty() {
                    let (taken, ids) = self.longest_run(text, &group[start..], budget)?;
                    runs.push((start..start + taken, ids));
                }
                for (run, ids) in runs {
                    start = run.end;
                    if !text[group[run.start].range.start..group[run.end - 1].range.end]
                        .trim()
                        .is_empty()
                    {
                        segments.push(ids);
                    }
                }
            }
        }
        Ok(segments)
    }

    /// What checking the run of `pieces`' first `count` (a sentence first) tells: whether it
    /// fits, and whether one piece more does (there being one); each run encoded once.
    fn checked_run(&self, text: &str, pieces: &[Piece], count: usize, budget: usize) -> Result<Bounds, EngineError> {
        let ids = self.encode_run(text, pieces, count)?;
        if ids.len() > budget {
            return Ok(Bounds::sentence(Some(count)));
        }
        if count == pieces.len() {
            return Ok(Bounds::fitting(count, ids, None));
        }
        let more = self.encode_run(text, pieces, count + 1)?;
        Ok(if more.len() > budget {
            Bounds::fitting(count, ids, Some(count + 1))
        } else {
            Bounds::fitting(count + 1, more, None)
        })
    }

    /// The tokens of the run of `pieces`' first `count` (its text trimmed).
    fn encode_run(&self, text: &str, pieces: &[Piece], count: usize) -> Result<Vec<u32>, EngineError> {
        self.encode(text[pieces[0].range.start..pieces[count - 1].range.end].trim())
    }

    /// The pieces of `text` to pack, in order, in groups no segment spans: sentences,
    /// except that a sentence over the budget is cut into words that start a new group
    /// (the sentences after it may join its last segment).
    fn groups(&self, text: &str, budget: usize) -> Result<Vec<Vec<Piece>>, EngineError> {
        let sentences: Vec<Range<usize>> = sentences(text).collect();
        // Each sentence alone, and as it follows the one before in a run: after that one's
        // trailing white space.
        let counts = (0..sentences.len())
            .into_par_iter()
            .map(|i| {
                let sentence = &sentences[i];
                let end = sentence.start + text[sentence.clone()].trim_end().len();
                let alone = self.encode(text[sentence.clone()].trim())?.len();
                let joined = match i.checked_sub(1).map(|before| &sentences[before]) {
                    Some(before) => {
                        let space = before.start + text[before.clone()].trim_end().len();
                        self.encode(&text[space..end])?.len()
                    }
                    None => alone,
                };
                Ok(Counts { alone, joined })
            })
            .collect::<Result<Vec<Counts>, EngineError>>()?;
        let mut groups = vec![Vec::new()];
        for (sentence, tokens) in sentences.into_iter().zip(counts) {
            if tokens.alone <= budget {
                let piece = Piece {
                    range: sentence,
                    tokens: Some(tokens),
                };
                groups.last_mut().expect("one group at least").push(piece);
                continue;
            }
            let mut words = Vec::new();
            let mut at = sentence.start;
            let whole = text[sentence.clone()].trim();
            for word in text[sentence].split_inclusive(char::is_whitespace) {
                let range = at..at + word.len();
                at += word.len();
                // A sentence of one word (Chinese with no space) is known to be over: not
                // encoded again.
                let trimmed = word.trim();
                if word.chars().any(unspaced) && (trimmed == whole || self.encode(trimmed)?.len() > budget) {
                    self.cut_unspaced(text, range, budget, &mut words)?;
                } else {
                    words.push(Piece { range, tokens: None });
                }
            }
            groups.push(words);
        }
        Ok(groups)
    }

    /// Appends the pieces of `text[range]`, a word over the budget written in a script
    /// without spaces: its clauses (each ending after a pause mark), and each clause still
    /// over the budget cut between its characters (grapheme clusters).
    fn cut_unspaced(
        &self,
        text: &str,
        range: Range<usize>,
        budget: usize,
        pieces: &mut Vec<Piece>,
    ) -> Result<(), EngineError> {
        let mut at = range.start;
        for clause in text[range].split_inclusive(PAUSES) {
            if self.encode(clause.trim())?.len() <= budget {
                pieces.push(Piece {
                    range: at..at + clause.len(),
                    tokens: None,
                });
            } else {
                for (offset, character) in clause.grapheme_indices(true) {
                    pieces.push(Piece {
                        range: at + offset..at + offset + character.len(),
                        tokens: None,
                    });
                }
            }
            at += clause.len();
        }
        Ok(())
    }

    /// How many of `pieces`, from the first, make the longest run that fits the budget, and
    /// that run's tokens; an error naming the first piece when it alone does not fit.
    fn longest_run(&self, text: &str, pieces: &[Piece], budget: usize) -> Result<(usize, Vec<u32>), EngineError> {
        // A sentence is known to fit; a word is encoded alone first.
        let mut bounds = match pieces[0].tokens {
            Some(_) => Bounds::sentence(None),
            None => {
                let ids = self.encode_run(text, pieces, 1)?;
                if ids.len() > budget {
                    return Err(EngineError::Input(format!(
                        "the word {:?} alone needs more than the {budget} tokens that fit the context",
                        text[pieces[0].range.clone()].trim()
                    )));
                }
                Bounds::fitting(1, ids, None)
            }
        };
        // Where the pieces' own counts put the end (a run of words, whose counts are not
        // known, starts from one piece).
        let estimate = estimated_run(pieces, budget);
        if estimate > 1 {
            let ids = self.encode_run(text, pieces, estimate)?;
            if ids.len() <= budget {
                bounds = Bounds::fitting(estimate, ids, None);
            } else {
                bounds.too_long = Some(estimate);
            }
        }
        self.search(text, pieces, budget, bounds)
    }

    /// The longest run of `pieces`, from the first, that fits the budget, and its tokens,
    /// from what `bounds` knows already: gallop up from the longest run known to fit until
    /// one does not or every piece is taken, then bisect between the longest known to fit
    /// and the shortest known not to.
    fn search(
        &self,
        text: &str,
        pieces: &[Piece],
        budget: usize,
        bounds: Bounds,
    ) -> Result<(usize, Vec<u32>), EngineError> {
        let Bounds {
            mut fits,
            mut fitting_ids,
            mut too_long,
        } = bounds;
        let mut step = 1;
        while too_long.is_none() && fits < pieces.len() {
            let count = (fits + step).min(pieces.len());
            let ids = self.encode_run(text, pieces, count)?;
            if ids.len() <= budget {
                (fits, fitting_ids) = (count, Some(ids));
                step *= 2;
            } else {
                too_long = Some(count);
            }
        }
        if let Some(mut too_long) = too_long {
            while too_long - fits > 1 {
                let count = fits + (too_long - fits) / 2;
                let ids = self.encode_run(text, pieces, count)?;
                if ids.len() <= budget {
                    (fits, fitting_ids) = (count, Some(ids));
                } else {
                    too_long = count;
                }
            }
        }
        let ids = match fitting_ids {
            Some(ids) => ids,
            None => self.encode_run(text, pieces, fits)?,
        };
        Ok((fits, ids))
    }
}

/// What is known of the runs from a first piece: the longest known to fit, with its tokens
/// when they were encoded, and the shortest known not to.
struct Bounds {
    fits: usize,
    fitting_ids: Option<Vec<u32>>,
    too_long: Option<usize>,
}

impl Bounds {
    /// A sentence first, which fits alone (not encoded yet), and the shortest run known not
    /// to fit.
    fn sentence(too_long: Option<usize>) -> Bounds {
        Bounds {
            fits: 1,
            fitting_ids: None,
            too_long,
        }
    }

    /// The run of `fits` pieces fits, with tokens `ids`.
    fn fitting(fits: usize, ids: Vec<u32>, too_long: Option<usize>) -> Bounds {
        Bounds {
            fits,
            fitting_ids: Some(ids),
            too_long,
        }
    }
}

/// How many of `pieces`, from the first, fit the budget by their counts (the first alone,
/// each after it joined; a word, whose count is not known, ends the run); at least one.
fn estimated_run(pieces: &[Piece], budget: usize) -> usize {
    let mut summed = 0;
    pieces
        .iter()
        .enumerate()
        .take_while(|(i, piece)| {
            summed += piece
                .tokens
                .map_or(budget + 1, |c| if *i == 0 { c.alone } else { c.joined });
            summed <= budget
        })
        .count()
        .max(1)
}

/// The runs `pieces` pack into when a run's tokens are its pieces' counts added up
/// ([`estimated_run`]): (first piece, pieces) of each, in order, up to the first word or
/// the end, at most `limit` of them.
fn predicted_runs(pieces: &[Piece], budget: usize, limit: usize) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut first = 0;
    while first < pieces.len() && pieces[first].tokens.is_some() && runs.len() < limit {
        let count = estimated_run(&pieces[first..], budget);
        runs.push((first, count));
        first += count;
    }
    runs
}

/// A piece of text to pack: its byte range and, for a sentence, its token counts.
struct Piece {
    range: Range<usize>,
    tokens: Option<Counts>,
}

/// A sentence's token counts, which predict where a run of sentences reaches the budget:
/// with a tokenizer that splits text at white space before merging, a run's tokens are its
/// first sentence's `alone` and the others' `joined` added up. Where that does not hold (a
/// full-width end, with no space after it, may merge with the text that follows), the
/// check of the predicted run fails and the run is searched for.
#[derive(Clone, Copy)]
struct Counts {
    /// Its trimmed text's.
    alone: usize,
    /// Its text after the white space that ends the sentence before (in a run, it follows
    /// that); the first sentence's alone.
    joined: usize,
}

/// The full-width sentence ends: 。！？；
const FULL_WIDTH_ENDS: [char; 4] = ['\u{3002}', '\u{ff01}', '\u{ff1f}', '\u{ff1b}'];

/// The closing quotes and brackets that may follow a full-width end: 」』）】〉》”’
const FULL_WIDTH_CLOSERS: [char; 8] = [
    '\u{300d}', '\u{300f}', '\u{ff09}', '\u{3011}', '\u{3009}', '\u{300b}', '\u{201d}', '\u{2019}',
];

/// The pause marks a word of a script without spaces is first cut after: 、，： and `,`.
const PAUSES: [char; 4] = ['\u{3001}', '\u{ff0c}', '\u{ff1a}', ','];

/// Whether `c` is of a script written without spaces between words, whose "word" (text
/// between white space) may be a whole sentence: Chinese characters, Japanese kana, their
/// punctuation and full-width forms.
fn unspaced(c: char) -> bool {
    matches!(
        u32::from(c),
        0x3000..=0x30ff | 0x3400..=0x4dbf | 0x4e00..=0x9fff | 0xf900..=0xfaff | 0xff00..=0xffef | 0x20000..=0x2fa1f
    )
}

/// Sentences with their trailing white space, as byte ranges of `text` in order, each found
/// as it is asked for (the first sentence of a long text is found without reading the rest).
fn sentences(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        while let Some((_, c)) = chars.next() {
            // Full-width ends need no space after them (Chinese and Japanese put none), and
            // the closing quotes and brackets after one stay with its sentence.
            let full_width = FULL_WIDTH_ENDS.contains(&c);
            if full_width {
                while chars.next_if(|&(_, n)| FULL_WIDTH_CLOSERS.contains(&n)).is_some() {}
            }
            let ends = full_width
                || matches!(c, '.' | '!' | '?' | ';') && chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
            if ends || c == '\n' {
                while chars.next_if(|&(_, n)| n.is_whitespace()).is_some() {}
                let end = chars.peek().map_or(text.len(), |&(at, _)| at);
                return Some(std::mem::replace(&mut start, end)..end);
            }
        }
        (start < text.len()).then(|| std::mem::replace(&mut start, text.len())..text.len())
    })
}

#[cfg(test)]
mod tests {
    use super::sentences;

    #[test]
    fn sentences_keep_every_character_in_order() {
        let text = "Hello there. How are you?\nFine; thanks. 3.14 is pi";
        let parts: Vec<&str> = sentences(text).map(|range| &text[range]).collect();
        assert_eq!(parts.concat(), text);
        assert_eq!(parts.len(), 5);
        assert_eq!(parts[4], "3.14 is pi");
    }

    /// The full-width ends (。！？；) end a sentence with no space after them, keeping the
    /// closing quotes and brackets after them.
    #[test]
    fn full_width_ends_need_no_space() {
        let quoted = "\u{300c}\u{597d}\u{3002}\u{300d}\u{771f}";
        let parts: Vec<&str> = sentences(quoted).map(|range| &quoted[range]).collect();
        assert_eq!(parts, ["\u{300c}\u{597d}\u{3002}\u{300d}", "\u{771f}"]);
        let text = "\u{4eca}\u{5929}\u{3002}\u{597d}\u{ff01}\u{771f}\u{ff1f}\u{662f}\u{ff1b}\u{5417} a.b";
        let parts: Vec<&str> = sentences(text).map(|range| &text[range]).collect();
        assert_eq!(
            parts,
            [
                "\u{4eca}\u{5929}\u{3002}",
                "\u{597d}\u{ff01}",
                "\u{771f}\u{ff1f}",
                "\u{662f}\u{ff1b}",
                "\u{5417} a.b"
            ]
        );
    }
}
