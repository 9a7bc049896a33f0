#!/usr/bin/env python3
"""Writes the man page meshalloc(3) from docs/options.md, with the standard library only.

usage: options_to_man.py docs/options.md VERSION OUT

The page opens with NAME, SYNOPSIS (meshalloc.h, the link lines) and DESCRIPTION, then holds
docs/options.md converted section by section: headings, paragraphs, lists, code blocks, and
tables as tagged paragraphs (first column as the tag, the middle columns after it, the last as
the text). Markdown links keep their text only.
"""
import re
import sys

HEAD = r""".TH MESHALLOC 3 "" "meshalloc {version}" "meshalloc manual"
.SH NAME
meshalloc \- a malloc replacement that compacts the heap by meshing pages: options and control
.SH SYNOPSIS
.nf
.B #include <meshalloc.h>
.PP
.BI "int meshalloc_mallctl(const char *" name ", void *" oldp ", size_t *" oldlenp ,
.BI "                      void *" newp ", size_t " newlen );
.B size_t meshalloc_compact(void);
.BI "void meshalloc_print_stats(int " fd ", int " json );
.PP
Link with \fB\-lmeshalloc\fR (\fBpkg\-config \-\-cflags \-\-libs meshalloc\fR, or
\fBfind_package(meshalloc)\fR and \fBmeshalloc::meshalloc\fR in CMake), or preload it:
\fBLD_PRELOAD=\fR\fIlibdir\fR\fB/libmeshalloc.so\fR \fIprogram\fR
.fi
.SH DESCRIPTION
meshalloc provides \fBmalloc\fR(3), \fBfree\fR(3), \fBcalloc\fR(3), \fBrealloc\fR(3), the
aligned variants and the C++ \fBoperator new\fR and \fBdelete\fR. \fBmeshalloc_mallctl\fR()
reads and writes statistics and options by name, in the style of jemalloc's \fBmallctl\fR
(the names are listed in meshalloc.h), \fBmeshalloc_compact\fR() meshes every size class now,
and \fBmeshalloc_print_stats\fR() writes the statistics report. The rest of this page is the
description of the options, set through the environment.
"""

TAIL = r""".SH SEE ALSO
\fBmeshalloc\fR (the command-line tool: \fBmeshalloc \-\-help\fR),
the documents api.md, cli.md and options.md in the package's documentation directory
(/usr/share/doc/meshalloc).
"""


def escape(text: str) -> str:
    return text.replace("\\", "\\e").replace("-", "\\-")


def inline(text: str) -> str:
    """Markdown inline markup to roff: `code` and **bold** in bold, *emphasis* in italics."""
    out = []
    for index, piece in enumerate(re.split(r"`([^`]*)`", text)):
        if index % 2:
            out.append("\\fB" + escape(piece) + "\\fR")
            continue
        piece = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", piece)  # links: text only
        piece = escape(piece)
        piece = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", piece)
        piece = re.sub(r"\*([^*]+)\*", r"\\fI\1\\fR", piece)
        out.append(piece)
    return "".join(out)


def line(text: str) -> str:
    """A text line roff will not take for a request."""
    return "\\&" + text if text[:1] in (".", "'") else text


def cells(row: str):
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def convert(markdown: str) -> str:
    out = []
    lines = markdown.splitlines()
    i = 0
    paragraph = []

    def flush():
        if paragraph:
            out.append(".PP")
            out.append(line(inline(" ".join(paragraph))))
            paragraph.clear()

    while i < len(lines):
        text = lines[i]
        stripped = text.strip()
        if stripped.startswith("```"):
            flush()
            out.append(".PP\n.nf\n.RS 4")
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                out.append(line(escape(lines[i])))
                i += 1
            out.append(".RE\n.fi")
        elif stripped.startswith("#"):
            flush()
            level = len(stripped) - len(stripped.lstrip("#"))
            title = inline(stripped[level:].strip())
            if level == 1:  # the document's title: the page has its own
                pass
            elif level == 2:
                out.append(".SH " + title.upper())
            else:
                out.append(".SS " + title)
        elif stripped.startswith("|"):
            flush()
            header = cells(stripped)
            i += 2  # the header and its |---| line
            if len(header) > 2:
                out.append(".PP\nEach entry: " + inline(", ".join(header[:-1])) + ".")
            while i < len(lines) and lines[i].strip().startswith("|"):
                row = cells(lines[i])
                out.append(".TP\n" + line(inline(", ".join(row[:-1]))))
                out.append(line(inline(row[-1])))
                i += 1
            continue
        elif re.match(r"(\d+\.|-) ", stripped):
            flush()
            marker, _, rest = stripped.partition(" ")
            item = [rest]
            while i + 1 < len(lines) and lines[i + 1].startswith("  ") and lines[i + 1].strip():
                i += 1
                item.append(lines[i].strip())
            out.append(".IP " + ("\\(bu" if marker == "-" else marker) + " 4")
            out.append(line(inline(" ".join(item))))
        elif not stripped:
            flush()
        else:
            paragraph.append(stripped)
        i += 1
    flush()
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: options_to_man.py OPTIONS.md VERSION OUT\n")
        return 2
    source, version, target = argv[1:]
    with open(source, encoding="utf-8") as handle:
        body = convert(handle.read())
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(HEAD.format(version=version) + body + TAIL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
