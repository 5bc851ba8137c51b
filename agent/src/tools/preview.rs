//! Previews of what a call waiting for approval would do: the line diff of a write, what a deletion loses.
//!
//! A preview is worked out on the server once, when the call asks, and travels in the approval request, so every
//! tab shows the same thing and the browser needs no diff code. Everything here is bounded: at most
//! [`PREVIEW_READ_BYTES`] of a file are read, at most [`PREVIEW_DIFF_LINES`] lines of a diff are kept, each line at
//! most [`PREVIEW_LINE_CHARS`] characters, and the diff itself gets [`DIFF_TIME`] (after which `similar` settles for
//! a coarser, still correct, diff).

use std::time::Duration;

use similar::{ChangeTag, TextDiff};

use crate::wire::{ApprovalPreview, DiffLine, FileDiff};

/// The most of a file a preview reads.
pub const PREVIEW_READ_BYTES: usize = 256 * 1024;
/// The most lines of a diff a preview keeps; the rest are counted in `omitted`.
pub const PREVIEW_DIFF_LINES: usize = 160;
/// The most characters of one line a preview keeps.
pub const PREVIEW_LINE_CHARS: usize = 300;
/// The lines of a file to be deleted that a preview shows.
pub const PREVIEW_HEAD_LINES: usize = 10;
/// The bytes read to show the head of a file to be deleted.
pub const PREVIEW_HEAD_BYTES: usize = 8 * 1024;
/// Unchanged lines shown around each change; longer unchanged stretches are folded.
const CONTEXT_LINES: usize = 3;
/// How long the diff may take before it settles for a coarser one.
const DIFF_TIME: Duration = Duration::from_millis(200);

/// The text of `bytes`, when they are text: UTF-8 without NUL bytes. A character cut off at the end (the bytes are
/// a prefix of the file) does not make them binary; it is left out.
pub fn as_text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(error) if error.error_len().is_none() => {
            std::str::from_utf8(&bytes[..error.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

/// One line as a preview shows it: without its line ending, cut to [`PREVIEW_LINE_CHARS`].
fn shown(line: &str) -> String {
    let line = line.trim_end_matches(['\n', '\r']);
    match line.char_indices().nth(PREVIEW_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

fn number(index: usize) -> u32 {
    u32::try_from(index + 1).unwrap_or(u32::MAX)
}

/// Collects diff lines, then keeps what fits the bound, counting what goes past it.
#[derive(Default)]
struct Lines {
    diff: FileDiff,
    all: Vec<DiffLine>,
}

impl Lines {
    fn push(&mut self, line: DiffLine) {
        match &line {
            DiffLine::Added { .. } => self.diff.added += 1,
            DiffLine::Removed { .. } => self.diff.removed += 1,
            DiffLine::Same { .. } | DiffLine::Folded { .. } => {}
        }
        self.all.push(line);
    }

    /// The diff with the lines that fit the bound, in order. Removed lines take at most half of it while added
    /// lines are still to come, so that a write replacing a long file shows what it writes, not only what it
    /// removes.
    fn finish(mut self) -> FileDiff {
        let mut added_to_come = self.diff.added;
        let mut removed_kept = 0;
        for line in self.all {
            if matches!(line, DiffLine::Added { .. }) {
                added_to_come -= 1;
            }
            let removed = matches!(line, DiffLine::Removed { .. });
            let crowding = removed && added_to_come > 0 && removed_kept >= PREVIEW_DIFF_LINES / 2;
            if self.diff.lines.len() < PREVIEW_DIFF_LINES && !crowding {
                removed_kept += usize::from(removed);
                self.diff.lines.push(line);
            } else if !matches!(line, DiffLine::Folded { .. }) {
                self.diff.omitted += 1;
            }
        }
        self.diff
    }
}

/// The diff of writing `new` over a file whose whole content is `old` (`None`: there is no file yet).
pub fn file_diff(old: Option<&str>, new: &str) -> FileDiff {
    let mut lines = Lines::default();
    lines.diff.new_bytes = new.len() as u64;
    let Some(old) = old else {
        lines.diff.new_file = true;
        for (index, line) in new.lines().enumerate() {
            lines.push(DiffLine::Added {
                new: number(index),
                text: shown(line),
            });
        }
        return lines.finish();
    };
    lines.diff.old_bytes = Some(old.len() as u64);
    let diff = TextDiff::configure()
        .timeout(DIFF_TIME)
        .diff_lines(old, new);
    // Where the last group shown ended, in the old and the new text: what lies between groups is folded.
    let (mut old_end, mut new_end) = (0, 0);
    for group in diff.grouped_ops(CONTEXT_LINES) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let skipped = first.old_range().start - old_end;
        if skipped > 0 {
            lines.push(DiffLine::Folded {
                old: number(old_end),
                new: number(new_end),
                count: u32::try_from(skipped).unwrap_or(u32::MAX),
            });
        }
        for op in &group {
            for change in diff.iter_changes(op) {
                let text = shown(change.value());
                lines.push(
                    match (change.tag(), change.old_index(), change.new_index()) {
                        (ChangeTag::Insert, _, Some(new)) => DiffLine::Added {
                            new: number(new),
                            text,
                        },
                        (ChangeTag::Delete, Some(old), _) => DiffLine::Removed {
                            old: number(old),
                            text,
                        },
                        (_, old, new) => DiffLine::Same {
                            old: number(old.unwrap_or_default()),
                            new: number(new.unwrap_or_default()),
                            text,
                        },
                    },
                );
            }
        }
        old_end = last.old_range().end;
        new_end = last.new_range().end;
    }
    if lines.diff.added == 0 && lines.diff.removed == 0 {
        lines.diff.note = Some("No change: the file already holds exactly this content.".into());
        return lines.diff;
    }
    let rest = diff.old_len() - old_end;
    if rest > 0 {
        lines.push(DiffLine::Folded {
            old: number(old_end),
            new: number(new_end),
            count: u32::try_from(rest).unwrap_or(u32::MAX),
        });
    }
    lines.finish()
}

/// The diff of a write when the file as it is cannot be compared line by line: too large, or not text.
pub fn uncomparable(old_bytes: u64, new: &str, why: String) -> FileDiff {
    FileDiff {
        old_bytes: Some(old_bytes),
        new_bytes: new.len() as u64,
        note: Some(why),
        ..FileDiff::default()
    }
}

/// The preview of deleting a file of `size` bytes that begins with `head`.
pub fn deletion(path: String, size: u64, head: &[u8]) -> ApprovalPreview {
    let Some(text) = as_text(head) else {
        return ApprovalPreview::FileDelete {
            path,
            bytes: size,
            head: Vec::new(),
            more: false,
            note: Some("The file is not text.".into()),
        };
    };
    let all: Vec<&str> = text.lines().collect();
    let shown_lines: Vec<String> = all
        .iter()
        .take(PREVIEW_HEAD_LINES)
        .map(|line| shown(line))
        .collect();
    let more = all.len() > PREVIEW_HEAD_LINES || (head.len() as u64) < size;
    ApprovalPreview::FileDelete {
        path,
        bytes: size,
        head: shown_lines,
        more,
        note: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(count: usize) -> String {
        (1..=count).map(|n| format!("line {n}\n")).collect()
    }

    /// A write that replaces a long file with other text shows some of what it writes, not only the removals
    /// that come first in the diff.
    #[test]
    fn removed_lines_leave_room_for_the_added_ones() {
        let new: String = (1..=300).map(|n| format!("new {n}\n")).collect();
        let diff = file_diff(Some(&numbered(1_000)), &new);
        let count = |added: bool| {
            diff.lines
                .iter()
                .filter(|line| match line {
                    DiffLine::Added { .. } => added,
                    DiffLine::Removed { .. } => !added,
                    _ => false,
                })
                .count()
        };
        assert_eq!(diff.lines.len(), PREVIEW_DIFF_LINES);
        assert_eq!(count(false), PREVIEW_DIFF_LINES / 2);
        assert_eq!(count(true), PREVIEW_DIFF_LINES / 2);
        assert_eq!(
            diff.omitted,
            1_000 + 300 - PREVIEW_DIFF_LINES as u32,
            "the rest is counted"
        );
        assert_eq!((diff.added, diff.removed), (300, 1_000));
    }

    #[test]
    fn a_new_file_is_all_added_lines_numbered_from_one() {
        let diff = file_diff(None, "a\nb\n");
        assert!(diff.new_file);
        assert_eq!(diff.old_bytes, None);
        assert_eq!((diff.added, diff.removed, diff.new_bytes), (2, 0, 4));
        assert_eq!(
            diff.lines,
            [
                DiffLine::Added {
                    new: 1,
                    text: "a".into()
                },
                DiffLine::Added {
                    new: 2,
                    text: "b".into()
                },
            ]
        );
    }

    #[test]
    fn an_overwrite_shows_changed_lines_with_both_numbers_and_context() {
        let diff = file_diff(Some("one\ntwo\nthree\n"), "one\n2\nthree\nfour\n");
        assert!(!diff.new_file);
        assert_eq!(diff.old_bytes, Some(14));
        assert_eq!((diff.added, diff.removed), (2, 1));
        assert_eq!(
            diff.lines,
            [
                DiffLine::Same {
                    old: 1,
                    new: 1,
                    text: "one".into()
                },
                DiffLine::Removed {
                    old: 2,
                    text: "two".into()
                },
                DiffLine::Added {
                    new: 2,
                    text: "2".into()
                },
                DiffLine::Same {
                    old: 3,
                    new: 3,
                    text: "three".into()
                },
                DiffLine::Added {
                    new: 4,
                    text: "four".into()
                },
            ]
        );
    }

    #[test]
    fn long_unchanged_stretches_are_folded() {
        let old = numbered(100);
        let new = old
            .replace("line 10\n", "line ten\n")
            .replace("line 90\n", "line ninety\n");
        let diff = file_diff(Some(&old), &new);
        assert_eq!((diff.added, diff.removed), (2, 2));
        let folds: Vec<_> = diff
            .lines
            .iter()
            .filter_map(|line| match line {
                DiffLine::Folded { old, new, count } => Some((*old, *new, *count)),
                _ => None,
            })
            .collect();
        // Lines 1-6 before the first change, 14-86 between the changes, 94-100 after the last.
        assert_eq!(folds, [(1, 1, 6), (14, 14, 73), (94, 94, 7)]);
        assert_eq!(diff.lines.len(), 3 + 2 * (3 + 2 + 3));
    }

    #[test]
    fn a_large_file_is_bounded_and_says_how_much_was_left_out() {
        let new = numbered(1_000);
        let diff = file_diff(None, &new);
        assert_eq!(diff.lines.len(), PREVIEW_DIFF_LINES);
        assert_eq!(diff.added, 1_000);
        assert_eq!(diff.omitted as usize, 1_000 - PREVIEW_DIFF_LINES);

        let long = "x".repeat(10_000);
        let diff = file_diff(Some(""), &long);
        let DiffLine::Added { text, .. } = &diff.lines[0] else {
            panic!("{:?}", diff.lines)
        };
        assert_eq!(text.chars().count(), PREVIEW_LINE_CHARS + 1);
        assert!(text.ends_with('…'));
    }

    #[test]
    fn writing_the_same_content_says_nothing_changes() {
        let diff = file_diff(Some("same\n"), "same\n");
        assert_eq!((diff.added, diff.removed), (0, 0));
        assert!(diff.lines.is_empty());
        assert!(diff.note.unwrap().starts_with("No change"));
    }

    #[test]
    fn a_deletion_shows_the_size_and_first_lines() {
        let ApprovalPreview::FileDelete {
            bytes, head, more, ..
        } = deletion("a".into(), 1234, numbered(20).as_bytes())
        else {
            panic!()
        };
        assert_eq!(bytes, 1234);
        assert_eq!(head.len(), PREVIEW_HEAD_LINES);
        assert_eq!(head[0], "line 1");
        assert!(more);
        let ApprovalPreview::FileDelete { head, more, .. } = deletion("a".into(), 4, b"a\nb\n")
        else {
            panic!()
        };
        assert_eq!((head.len(), more), (2, false));
        let ApprovalPreview::FileDelete { head, note, .. } =
            deletion("a".into(), 3, b"\x00\x01\x02")
        else {
            panic!()
        };
        assert!(head.is_empty());
        assert_eq!(note.as_deref(), Some("The file is not text."));
    }

    #[test]
    fn text_is_utf8_without_nul_and_a_cut_character_is_dropped() {
        assert_eq!(as_text("é".as_bytes()), Some("é"));
        assert_eq!(as_text(&"aé".as_bytes()[..2]), Some("a"));
        assert_eq!(as_text(b"a\0b"), None);
        assert_eq!(as_text(b"\xff\xfe"), None);
    }
}
