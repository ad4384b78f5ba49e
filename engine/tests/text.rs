//! The text front end on a generated checkpoint's tokenizer: encoding, and the splitting rule.

use drama_checkpoint::{Checkpoint, Provenance};
use drama_engine::text::TextFrontEnd;
use rand_core::Rng;
use unicode_segmentation::UnicodeSegmentation;

fn front() -> (tempfile::TempDir, TextFrontEnd) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 1, &path).unwrap();
    let checkpoint = Checkpoint::open(&path, Provenance::Local(path.clone())).unwrap();
    (dir, TextFrontEnd::new(&checkpoint))
}

/// A tokenizer file's truncation and padding settings do not apply (contract 9.1): with a
/// truncation to 4 tokens whose stride is not below it (which would panic) and padding to
/// 64, the tokens and segments are the plain file's.
#[test]
fn the_files_truncation_and_padding_do_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let preset = drama_fixtures::Preset::by_name("tiny").expect("tiny preset");
    let mut draft = drama_fixtures::generate(&preset, 1).unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_str(&draft.tokenizer).unwrap();
    tokenizer["truncation"] = serde_json::json!({
        "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 4
    });
    tokenizer["padding"] = serde_json::json!({
        "strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "a"
    });
    draft.tokenizer = tokenizer.to_string();
    let path = dir.path().join("truncating");
    draft.write(&path).unwrap();
    let checkpoint = Checkpoint::open(&path, Provenance::Local(path.clone())).unwrap();
    let truncating = TextFrontEnd::new(&checkpoint);
    let (_plain_dir, plain) = front();
    let text = "The thin cat sat on the mat. Then it slept through the whole afternoon!";
    let ids = plain.encode(text).unwrap();
    assert!(ids.len() > 8, "{ids:?}");
    assert_eq!(truncating.encode(text).unwrap(), ids);
    assert_eq!(
        truncating.segments(text, 20).unwrap(),
        plain.segments(text, 20).unwrap()
    );
}

#[test]
fn encodes_bytes_and_merges() {
    let (_dir, front) = front();
    let ids = front.encode("the thin cat").unwrap();
    // "the" and " th" are merged tokens (ids above the 256 byte symbols).
    assert!(ids.iter().any(|&id| id >= 256), "{ids:?}");
    assert!(ids.len() < "the thin cat".len());
    let all_bytes = front.encode("é\u{1F600}\t").unwrap();
    assert_eq!(
        all_bytes.len(),
        "é\u{1F600}\t".len(),
        "unmerged text is one token per byte"
    );
}

#[test]
fn segments_follow_sentences_and_the_budget() {
    let (_dir, front) = front();
    let text = "One two three. Four five six! Seven eight nine? Ten.";
    // The first sentence alone, the rest packed together.
    let whole = front.segments(text, 1000).unwrap();
    assert_eq!(
        whole,
        vec![
            front.encode("One two three.").unwrap(),
            front.encode("Four five six! Seven eight nine? Ten.").unwrap()
        ]
    );
    let sentence_budget = front.encode("Seven eight nine?").unwrap().len();
    let parts = front.segments(text, sentence_budget).unwrap();
    assert!(parts.len() >= 3, "{} segments", parts.len());
    assert!(parts.iter().all(|p| p.len() <= sentence_budget));
    // A line break ends a sentence even with no space after it.
    // (Cut between words instead, the first segment would take "three" too.)
    let line_budget = [
        front.encode("One two three").unwrap().len(),
        front.encode("three four").unwrap().len(),
    ]
    .into_iter()
    .max()
    .unwrap();
    let lines = front.segments("One two\nthree four", line_budget).unwrap();
    assert_eq!(
        lines,
        vec![front.encode("One two").unwrap(), front.encode("three four").unwrap()]
    );
    // A sentence longer than the budget is cut between words.
    let words = front.segments("alpha beta gamma delta epsilon.", 9).unwrap();
    assert!(words.len() > 1 && words.iter().all(|p| p.len() <= 9));
    let err = front.segments("supercalifragilistic", 5).unwrap_err().to_string();
    assert!(err.contains("supercalifragilistic"), "{err}");
    // Chinese over the budget, with no space: cut after its pause mark, then between
    // characters.
    let (first, second) = (
        "\u{4eca}\u{5929}\u{5f88}\u{597d}\u{ff0c}",
        "\u{6211}\u{4eec}\u{53bb}\u{516c}\u{56ed}",
    );
    let whole = format!("{first}{second}");
    let clause_budget = front
        .encode(first)
        .unwrap()
        .len()
        .max(front.encode(second).unwrap().len());
    assert!(front.encode(&whole).unwrap().len() > clause_budget);
    let clauses = front.segments(&whole, clause_budget).unwrap();
    assert_eq!(
        clauses,
        vec![front.encode(first).unwrap(), front.encode(second).unwrap()]
    );
    let character = whole
        .chars()
        .map(|c| front.encode(&c.to_string()).unwrap().len())
        .max()
        .unwrap();
    let characters = front.segments(&whole, character).unwrap();
    assert!(characters.len() > 2 && characters.iter().all(|p| p.len() <= character));
    let err = front.segments("  \n ", 10).unwrap_err().to_string();
    assert!(err.contains("empty"), "{err}");
}

/// The splitting rule done the plain way: every piece appended to the segment being filled
/// and the whole segment tokenized again, closed when the piece does not fit.
fn greedy_segments(front: &TextFrontEnd, text: &str, budget: usize) -> Option<Vec<Vec<u32>>> {
    let fits = |candidate: &str| {
        let ids = front.encode(candidate.trim()).unwrap();
        (ids.len() <= budget).then_some(ids)
    };
    let mut sentences = Vec::new();
    let mut rest = text;
    let closers = [
        '\u{300d}', '\u{300f}', '\u{ff09}', '\u{3011}', '\u{3009}', '\u{300b}', '\u{201d}', '\u{2019}',
    ];
    while let Some(end) = rest
        .char_indices()
        .find(|&(at, c)| {
            c == '\n'
                || matches!(c, '\u{3002}' | '\u{ff01}' | '\u{ff1f}' | '\u{ff1b}')
                || matches!(c, '.' | '!' | '?' | ';')
                    && rest[at + c.len_utf8()..].chars().next().is_none_or(char::is_whitespace)
        })
        .map(|(at, c)| {
            let after = at + c.len_utf8();
            match c {
                '.' | '!' | '?' | ';' | '\n' => after,
                _ => after + rest[after..].len() - rest[after..].trim_start_matches(closers).len(),
            }
        })
    {
        let tail = rest[end..].len() - rest[end..].trim_start().len();
        sentences.push(&rest[..end + tail]);
        rest = &rest[end + tail..];
    }
    if !rest.is_empty() {
        sentences.push(rest);
    }
    let (mut segments, mut current, mut current_ids) = (Vec::new(), String::new(), Vec::new());
    let close = |segments: &mut Vec<Vec<u32>>, current: &mut String, ids: &mut Vec<u32>| {
        if !current.trim().is_empty() {
            segments.push(std::mem::take(ids));
        }
        current.clear();
    };
    let mut first = true;
    for sentence in sentences {
        // The first sentence that is not blank is a segment of its own when it fits whole.
        let alone = first && !sentence.trim().is_empty() && fits(sentence).is_some();
        first &= sentence.trim().is_empty();
        let pieces: Vec<&str> = if fits(sentence).is_some() {
            vec![sentence]
        } else {
            close(&mut segments, &mut current, &mut current_ids);
            sentence
                .split_inclusive(char::is_whitespace)
                .flat_map(|word| unspaced_pieces(word, &fits))
                .collect()
        };
        for piece in pieces {
            let joined = format!("{current}{piece}");
            if let Some(ids) = fits(&joined) {
                (current, current_ids) = (joined, ids);
                continue;
            }
            close(&mut segments, &mut current, &mut current_ids);
            current_ids = fits(piece)?;
            current = piece.to_string();
        }
        if alone {
            close(&mut segments, &mut current, &mut current_ids);
        }
    }
    close(&mut segments, &mut current, &mut current_ids);
    Some(segments)
}

/// A word's pieces: itself, or, when it does not fit and holds a character of Chinese or
/// Japanese (CJK punctuation, kana, ideographs, full-width forms), its clauses after
/// 、，： and `,`, each clause that does not fit cut into grapheme clusters.
fn unspaced_pieces<'a>(word: &'a str, fits: &dyn Fn(&str) -> Option<Vec<u32>>) -> Vec<&'a str> {
    let cjk = |c: char| {
        matches!(c, '\u{3000}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}')
            || matches!(c, '\u{f900}'..='\u{faff}' | '\u{ff00}'..='\u{ffef}' | '\u{20000}'..='\u{2fa1f}')
    };
    if !word.chars().any(cjk) || fits(word).is_some() {
        return vec![word];
    }
    word.split_inclusive(['\u{3001}', '\u{ff0c}', '\u{ff1a}', ','])
        .flat_map(|clause| match fits(clause) {
            Some(_) => vec![clause],
            None => clause.graphemes(true).collect(),
        })
        .collect()
}

/// The tiny checkpoint's front end with its tokenizer's JSON changed by `edit`, and the
/// directory that holds it.
fn front_with_tokenizer(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, TextFrontEnd) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edited");
    let preset = drama_fixtures::Preset::by_name("tiny").unwrap();
    let mut draft = drama_fixtures::generate(&preset, 1).unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_str(&draft.tokenizer).unwrap();
    edit(&mut tokenizer);
    draft.tokenizer = tokenizer.to_string();
    draft.write(&path).unwrap();
    let checkpoint = Checkpoint::open(&path, Provenance::Local(path.clone())).unwrap();
    (dir, TextFrontEnd::new(&checkpoint))
}

/// With merges only after a space (" the" one token, "the" three), sentences measured
/// alone add up to more tokens than a run of them: the packing still takes the longest run
/// that fits, as plain greedy packing does.
#[test]
fn a_run_can_take_fewer_tokens_than_its_sentences_alone() {
    let (_dir, front) = front_with_tokenizer(|tokenizer| {
        let merges = tokenizer["model"]["merges"].as_array_mut().unwrap();
        merges.retain(|merge| !merge[0].as_str().unwrap().starts_with('t'));
    });
    assert_eq!(front.encode("the.").unwrap().len(), 4);
    assert_eq!(front.encode("the. the. the.").unwrap().len(), 8);
    let text = "the. ".repeat(12);
    for budget in [6, 8, 10, 13, 20] {
        let got = front.segments(&text, budget).unwrap();
        assert_eq!(Some(got), greedy_segments(&front, &text, budget), "budget {budget}");
    }
}

/// With merges across white space (". " one token, the text not split at spaces first), a
/// run takes fewer tokens than its sentences counted as they follow one another: the runs
/// those counts predict are too short, and the packing still takes the longest that fits.
#[test]
fn a_run_can_take_fewer_tokens_than_its_counts_predict() {
    let (_dir, front) = front_with_tokenizer(|tokenizer| {
        tokenizer["pre_tokenizer"]["use_regex"] = false.into();
        // The last merge ("a", "n") becomes (".", "Ġ"), its token renamed: the vocabulary
        // keeps its size.
        let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
        let id = vocab.remove("an").unwrap();
        vocab.insert(".Ġ".into(), id);
        let merges = tokenizer["model"]["merges"].as_array_mut().unwrap();
        *merges.last_mut().unwrap() = serde_json::json!([".", "Ġ"]);
    });
    assert_eq!(front.encode("the.").unwrap().len(), 2);
    assert_eq!(front.encode(" the.").unwrap().len(), 3);
    assert_eq!(front.encode("the. the.").unwrap().len(), 4);
    let text = "the. ".repeat(12);
    for budget in [4, 6, 8, 11] {
        let got = front.segments(&text, budget).unwrap();
        assert_eq!(Some(got), greedy_segments(&front, &text, budget), "budget {budget}");
    }
}

/// A random text of 1 to 80 words (Latin, Chinese with and without pause marks, kana with a
/// combining mark), each followed by a space, a sentence end, a line break or a full-width
/// end, which needs no space after it.
fn random_text(rng: &mut impl Rng) -> String {
    let words = [
        "the",
        "thin",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "supercalifragilistic",
        "3.14",
        "é",
        "tea",
        "then",
        "\u{4eca}\u{5929}",
        "\u{597d}",
        // A sentence's worth of Chinese with no space, one with pause marks, and kana with
        // a combining mark (か + ゙, one grapheme).
        "\u{4eca}\u{5929}\u{5929}\u{6c14}\u{5f88}\u{597d}\u{6211}\u{4eec}\u{53bb}\u{516c}\u{56ed}\u{6563}\u{6b65}",
        "\u{4f60}\u{597d}\u{ff0c}\u{4e16}\u{754c}\u{3001}\u{5929}\u{6c14}\u{ff1a}\u{5f88}\u{597d}",
        "\u{304b}\u{3099}\u{304f}\u{3053}\u{3046}",
    ];
    let ends = [
        " ",
        " ",
        " ",
        "  ",
        ". ",
        "! ",
        "? ",
        "; ",
        "\n",
        ".\n\n",
        ",",
        "\u{3002}",
        "\u{ff01}",
        "\u{ff1f}\u{ff1b}",
        "\u{3002}\u{300d}",
        "\u{300c}",
    ];
    let length = 1 + rng.next_u32() as usize % 80;
    let mut text = String::new();
    for _ in 0..length {
        text += words[rng.next_u32() as usize % words.len()];
        text += ends[rng.next_u32() as usize % ends.len()];
    }
    text
}

#[test]
fn segments_match_plain_greedy_packing_on_random_text() {
    let (_dir, front) = front();
    let mut rng = drama_engine::test_support::rng("segments_match_plain_greedy_packing_on_random_text");
    let mut refused = 0;
    for case in 0..300 {
        let text = random_text(&mut rng);
        let budget = 3 + rng.next_u32() as usize % 40;
        let want = greedy_segments(&front, &text, budget);
        match front.segments(&text, budget) {
            Ok(got) => assert_eq!(Some(got), want, "case {case}, budget {budget}: {text:?}"),
            Err(e) => {
                assert_eq!(want, None, "case {case}, budget {budget}: {text:?}: {e}");
                refused += 1;
            }
        }
    }
    assert!(refused < 300, "some texts must fit");
}

/// The first segment cut on its own, then the segments of the rest, are the whole text's
/// segments; where the whole is refused, the first or the rest is refused with the same
/// error. Leading white space and a first sentence over the budget are among the cases.
#[test]
fn the_first_segment_then_the_rest_are_the_whole_texts_segments() {
    let (_dir, front) = front();
    let mut rng = drama_engine::test_support::rng("the_first_segment_then_the_rest_are_the_whole_texts_segments");
    let (mut split, mut refused) = (0, 0);
    for case in 0..300 {
        let lead = ["", " ", "\n\n", " . "][rng.next_u32() as usize % 4];
        let text = format!("{lead}{}", random_text(&mut rng));
        let budget = 3 + rng.next_u32() as usize % 40;
        let whole = front.segments(&text, budget).map_err(|e| e.to_string());
        let parts = match front.first_segment(&text, budget) {
            Ok(None) => continue,
            Ok(Some((first, at))) => {
                split += 1;
                assert!(
                    !text[at..].trim().is_empty(),
                    "case {case}: nothing after the first segment"
                );
                front
                    .segments_after(&text[at..], budget)
                    .map(|rest| [vec![first], rest].concat())
            }
            Err(e) => Err(e),
        };
        let parts = parts.map_err(|e| e.to_string());
        refused += usize::from(whole.is_err());
        assert_eq!(parts, whole, "case {case}, budget {budget}: {text:?}");
    }
    assert!(
        split > 150 && refused > 0 && refused < split,
        "{split} split, {refused} refused"
    );
}
