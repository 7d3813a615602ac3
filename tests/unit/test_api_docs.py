"""The API reference's rendering (tools/api_docs.py): made-up descriptors in, markdown out."""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2

from tools import api_docs
from tools.api_docs import ErrorRow

Field = descriptor_pb2.FieldDescriptorProto


def _comment(proto: descriptor_pb2.FileDescriptorProto, path: tuple[int, ...], text: str) -> None:
    location = proto.source_code_info.location.add()
    location.path.extend(path)
    location.leading_comments = text


def made_up_file() -> descriptor_pb2.FileDescriptorProto:
    """One file of every kind of element the page describes, each commented."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="sessionlog/v1/x.proto", package="sessionlog.v1"
    )
    service = proto.service.add(name="ThingService")
    service.method.add(
        name="Get", input_type=".sessionlog.v1.GetRequest", output_type=".sessionlog.v1.Thing"
    )
    service.method.add(
        name="Watch",
        input_type=".sessionlog.v1.GetRequest",
        output_type=".sessionlog.v1.Thing",
        server_streaming=True,
    )
    request = proto.message_type.add(name="GetRequest")
    request.field.add(name="thing_id", number=1, type=Field.TYPE_STRING)
    thing = proto.message_type.add(name="Thing")
    thing.field.add(
        name="parts",
        number=1,
        type=Field.TYPE_MESSAGE,
        type_name=".sessionlog.v1.Thing.Part",
        label=Field.LABEL_REPEATED,
    )
    thing.field.add(name="kind", number=2, type=Field.TYPE_ENUM, type_name=".sessionlog.v1.Kind")
    thing.field.add(
        name="time", number=3, type=Field.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp"
    )
    thing.field.add(
        name="labels",
        number=4,
        type=Field.TYPE_MESSAGE,
        type_name=".sessionlog.v1.Thing.LabelsEntry",
        label=Field.LABEL_REPEATED,
    )
    thing.oneof_decl.add(name="_limit")
    thing.oneof_decl.add(name="size")
    thing.field.add(
        name="limit", number=5, type=Field.TYPE_UINT64, oneof_index=0, proto3_optional=True
    )
    thing.field.add(name="small", number=6, type=Field.TYPE_BOOL, oneof_index=1)
    part = thing.nested_type.add(name="Part")
    part.field.add(name="text", number=1, type=Field.TYPE_BYTES)
    entry = thing.nested_type.add(name="LabelsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=Field.TYPE_STRING)
    entry.field.add(name="value", number=2, type=Field.TYPE_STRING)
    kind = proto.enum_type.add(name="Kind")
    kind.value.add(name="KIND_UNSPECIFIED", number=0)
    kind.value.add(name="KIND_ROUND", number=1)
    _comment(proto, (6, 0), " ThingService keeps things.\n")
    _comment(proto, (6, 0, 2, 0), " Get reads one thing.\n")
    _comment(proto, (6, 0, 2, 1), " Watch streams a thing's changes.\n")
    _comment(proto, (4, 0), " GetRequest names a thing.\n")
    _comment(
        proto,
        (4, 0, 2, 0),
        " The thing's id: first_part, then\n the rest.\n\n A second paragraph.\n",
    )
    _comment(proto, (4, 1), " Thing is a thing.\n")
    _comment(proto, (4, 1, 2, 5), " Whether it is small.\n")
    _comment(proto, (4, 1, 3, 0), " Part is one part of a thing.\n")
    _comment(proto, (5, 0), " Kind says what shape a thing has.\n")
    _comment(proto, (5, 0, 2, 1), " Round things roll.\n")
    return proto


ROWS = [ErrorRow("THING_GONE", "NOT_FOUND", "ThingGone", "The thing is gone; ask for another.")]


def _headings(page: str) -> set[str]:
    return {
        api_docs.slug(line.lstrip("#").strip()) for line in page.splitlines() if line[:1] == "#"
    }


def test_each_element_is_described_with_its_comment() -> None:
    """Services list their RPCs with request and response, messages their fields with number,
    type and comment, enums their values; comments come through as paragraphs."""
    page = api_docs.render([made_up_file()], ROWS)
    assert "### ThingService\n\nThingService keeps things." in page
    assert "| [Watch](#thingservicewatch) | [`GetRequest`](#getrequest) | stream [`Thing`]" in page
    assert "#### ThingService.Get\n\n[`GetRequest`](#getrequest) → [`Thing`](#thing)" in page
    assert "Get reads one thing." in page
    assert "| `thing_id` = 1 | `string` | The thing's id: first\\_part, then the rest." in page
    assert "the rest.<br><br>A second paragraph. |" in page
    assert "| `parts` = 1 | repeated [`Thing.Part`](#thingpart) |  |" in page
    assert "| `kind` = 2 | [`Kind`](#kind) |" in page
    assert "[`google.protobuf.Timestamp`](https://protobuf.dev/" in page
    assert "| `labels` = 4 | map&lt;`string`, `string`&gt; |" in page
    assert "| `limit` = 5 (optional) | `uint64` |" in page
    assert "| `small` = 6 (oneof `size`) | `bool` | Whether it is small. |" in page
    assert "### Thing.Part\n\nPart is one part of a thing." in page
    assert "LabelsEntry" not in page
    assert "| `KIND_ROUND` | 1 | Round things roll. |" in page
    assert (
        "| `THING_GONE` | `NOT_FOUND` | `ThingGone` | The thing is gone; ask for another. |" in page
    )


def test_every_link_on_the_page_has_its_heading() -> None:
    """Each in-page link (a field's type, an RPC's request, the RPC table) names a heading's
    anchor as MkDocs derives it, so a strict build finds every anchor."""
    page = api_docs.render([made_up_file()], ROWS)
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert {"thingpart", "kind", "thingservicewatch", "getrequest"} <= links
    assert links - _headings(page) == set()


def test_sections_come_in_order_and_other_packages_are_left_out() -> None:
    """Services, messages, enums, error reasons, each once; an imported file of another package
    (google.protobuf's, say) is linked to, never described."""
    other = descriptor_pb2.FileDescriptorProto(name="google/x.proto", package="google.protobuf")
    other.message_type.add(name="Timestamp")
    page = api_docs.render([other, made_up_file()], ROWS)
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections == ["## Services", "## Messages", "## Enums", "## Error reasons"]
    assert "### Timestamp" not in page
    assert page.startswith(api_docs.HEADER)
    assert page.endswith("|\n")


def test_comment_text_cannot_break_the_markdown() -> None:
    """Outside code spans, emphasis, raw HTML, links and cell separators are escaped; a code
    span (one backtick or two) keeps its text but not a bare cell separator."""
    escaped = api_docs.cell("a_b *c* <x> [0, 1] a|b `c_d|e` ``f_g``")
    assert escaped == r"a\_b \*c\* &lt;x&gt; \[0, 1\] a\|b `c_d\|e` ``f_g``"
    assert api_docs.prose("one\n two\n\n three") == "one two\n\nthree"
    assert api_docs.prose("") == ""


def test_slug_is_markdowns() -> None:
    """The anchors are Python-Markdown's default slugs: lower case, punctuation dropped."""
    assert api_docs.slug("SessionLogService.Append") == "sessionlogserviceappend"
    assert api_docs.slug("SurfaceOp.Replace") == "surfaceopreplace"
    assert api_docs.slug("Error reasons") == "error-reasons"
