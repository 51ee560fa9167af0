"""What a corpus read counts (`CorpusStats`): inputs, files, documents, words, every file or zip
member skipped and why, and the first few problems by name; `summary()` is the line build-cache
reports.

Knows nothing of reading: the planner (prep/cache/corpus.py) and the readers (prep/cache/files.py,
prep/cache/zips.py) fill it in. MAX_MEMBER_BYTES, the default cap on a zip member's decompressed
size, lives here because the summary names it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MAX_MEMBER_BYTES = 64 << 20


@dataclass
class CorpusStats:
    inputs: int = 0
    files: int = 0                  # text files / members / JSONL files read
    documents: int = 0
    empty_documents: int = 0
    words: int = 0                  # whitespace-separated
    chars: int = 0
    bytes_read: int = 0             # bytes of text before decoding (decompressed)
    annotation_files: int = 0       # .xml / .anc skipped
    other_files: int = 0            # neither text nor annotation, skipped
    outside_data: int = 0           # OANC files outside OANC-GrAF/data/, skipped
    links_outside: int = 0          # symbolic links to files outside the given folder, skipped
    refused_members: int = 0        # unsafe zip member names
    oversize_members: int = 0       # zip members over the size cap
    damaged_members: int = 0        # CRC / decompression errors
    files_with_bad_bytes: int = 0
    bad_bytes: int = 0
    jsonl_lines: int = 0
    bad_jsonl_lines: int = 0
    problems: list = field(default_factory=list)   # the first few, "where: what"

    def problem(self, where: str, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"{where}: {what}")

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.files} files", f"{self.documents} documents", f"{self.words:,} words"]
        if self.annotation_files:
            parts.append(f"{self.annotation_files} annotation files skipped")
        if self.other_files:
            parts.append(f"{self.other_files} other files skipped")
        if self.outside_data:
            parts.append(f"{self.outside_data} files outside OANC-GrAF/data skipped")
        if self.links_outside:
            parts.append(f"{self.links_outside} links to files outside the folder skipped")
        if self.refused_members:
            parts.append(f"{self.refused_members} unsafe zip members refused")
        if self.oversize_members:
            parts.append(f"{self.oversize_members} zip members over "
                         f"{MAX_MEMBER_BYTES >> 20} MiB skipped")
        if self.damaged_members:
            parts.append(f"{self.damaged_members} damaged zip members skipped")
        if self.bad_bytes:
            parts.append(f"{self.bad_bytes} undecodable bytes in {self.files_with_bad_bytes} "
                         "files (replaced)")
        if self.jsonl_lines:
            parts.append(f"{self.jsonl_lines} JSONL lines")
        if self.bad_jsonl_lines:
            parts.append(f"{self.bad_jsonl_lines} bad JSONL lines skipped")
        return ", ".join(parts)
