"""The report's registered sections and their templates: one template each, prose escaped once, no stray space."""

import pytest
from markupsafe import Markup

from kvroute.report import sections as rs
from kvroute.report.sections import SECTIONS, TEMPLATES


def test_every_registered_section_has_a_template_and_every_template_a_section():
    assert sorted(p.stem for p in TEMPLATES.glob("*.html")) == sorted(SECTIONS.names())


def test_the_findings_open_the_page_and_the_manifest_closes_it():
    names = SECTIONS.names()
    assert names[0] == "findings" and names[-1] == "manifest"
    assert [n for n, s in SECTIONS.items() if s.opening] == ["findings"]


@pytest.mark.parametrize(("source", "expected"), [
    # a paragraph's block: whitespace collapsed, the text escaped once (values and literal prose alike)
    ("{%- filter p %}\n  It's  <{{ x }}>\n  & more.\n{% endfilter %}", "<p>It&#x27;s &lt;a&quot;b&gt; &amp; more.</p>"),
    ("{{- x|note }}", '<p class="note">a&quot;b</p>'),
    # HTML made by code is placed as it is; text values are escaped; whitespace before a tag is dropped
    ("{{- html }}\n{{- x }}\n{%- if true %}{{ 0.5|g }} {{ 0.95|pct }}{% endif %}", "<b>t</b>a&#34;b0.5 95%"),
])
def test_template_filters(source, expected):
    out = rs._ENV.from_string(source).render(x='a"b', html=Markup("<b>t</b>"))
    assert out == expected
