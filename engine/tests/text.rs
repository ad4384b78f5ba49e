//! The text front end on a generated checkpoint's tokenizer: encoding, and the splitting rule.

use drama_engine::checkpoint::{Checkpoint, Provenance};
use drama_engine::text::TextFrontEnd;

fn front() -> (tempfile::TempDir, TextFrontEnd) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 1, &path).unwrap();
    let checkpoint = Checkpoint::open(&path, Provenance::Local(path.clone())).unwrap();
    (dir, TextFrontEnd::load(&checkpoint).unwrap())
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
    let whole = front.segments(text, 1000).unwrap();
    assert_eq!(whole.len(), 1);
    let sentence_budget = front.encode("Seven eight nine?").unwrap().len();
    let parts = front.segments(text, sentence_budget).unwrap();
    assert!(parts.len() >= 3, "{} segments", parts.len());
    assert!(parts.iter().all(|p| p.len() <= sentence_budget));
    // A sentence longer than the budget is cut between words.
    let words = front.segments("alpha beta gamma delta epsilon.", 9).unwrap();
    assert!(words.len() > 1 && words.iter().all(|p| p.len() <= 9));
    let err = front.segments("supercalifragilistic", 5).unwrap_err().to_string();
    assert!(err.contains("supercalifragilistic"), "{err}");
    let err = front.segments("  \n ", 10).unwrap_err().to_string();
    assert!(err.contains("empty"), "{err}");
}
