"""ListObjectsV2 answers parsed without trust: what a hostile or broken server may send is one SourceError."""

from __future__ import annotations

import pytest

from ckptfs.errors import SourceError
from ckptfs.sources.remote.s3_list import _parse_page

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def page(body: str) -> bytes:
    return f"<ListBucketResult {NS}>{body}</ListBucketResult>".encode()


def test_a_page_gives_the_objects_directly_below_and_the_next_token() -> None:
    found: dict[str, int] = {}
    token = _parse_page(page("<Name>b</Name><Prefix>p/</Prefix><Contents><Key>p/</Key><Size>0</Size></Contents>"
                             "<Contents><Key>p/.metadata</Key><Size>12</Size></Contents>"
                             "<CommonPrefixes><Prefix>p/sub/</Prefix></CommonPrefixes>"
                             "<IsTruncated>true</IsTruncated><NextContinuationToken>t1</NextContinuationToken>"),
                        "p/", found, "s3://b/p/")
    assert (token, found) == ("t1", {".metadata": 12})
    assert _parse_page(page("<IsTruncated>false</IsTruncated>"), "p/", found, "s3://b/p/") is None


@pytest.mark.parametrize("body, message", [
    (b"<ListBucketResult", "the listing is not XML"),
    (page("<Contents><Key>elsewhere/x</Key><Size>1</Size></Contents>"), "names 'elsewhere/x'"),
    (page("<Contents><Key>p/x</Key><Size>-1</Size></Contents>"), "of size '-1'"),
    (page("<Contents><Key>p/x</Key></Contents>"), "of size ''"),
    (page("<IsTruncated>true</IsTruncated>"), "a truncated listing without a continuation token"),
    (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
     b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
     b'<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">'
     b'<!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;"><!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">]>'
     b"<l><Contents><Key>&h;</Key><Size>1</Size></Contents></l>", "s3://b/p/: cannot list the prefix"),
])
def test_hostile_pages_are_one_error(body: bytes, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        _parse_page(body, "p/", {}, "s3://b/p/")
