"""Typesets sample_docs/harbor-light-annual-report-2023.pdf, a fictional company report
written for ktcli's tests and demos (CC0). Run: python sample_docs/tools/make_annual_report_pdf.py

Every section starts a new page, so each page holds its own checkable facts
(e.g. the Q3 revenue is on page 3) and page citations can be tested exactly.
"""

from __future__ import annotations

from pathlib import Path

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

OUT = Path(__file__).resolve().parent.parent / "harbor-light-annual-report-2023.pdf"

SECTIONS: list[tuple[str, list[str], list[list[str]] | None]] = [
    (
        "Harbor Light Lantern Company: Annual Report 2023",
        [
            "Harbor Light Lantern Company designs and manufactures storm lanterns, desk lamps and "
            "solar lights. The company was founded in 1987 by the glassblower Tobias Wren in Port "
            "Alder, a fishing town on the northern coast, and it has made lanterns there ever since.",
            "This report covers the fiscal year from 1 January 2023 to 31 December 2023. All amounts "
            "are in US dollars unless stated otherwise. Harbor Light is a fictional company: the "
            "report was written as sample material for document question answering, and every "
            "figure in it is invented.",
            "At a glance: revenue of $21.4 million (up 9.2 percent on 2022), 412 employees at year "
            "end, two factories, and products sold in 23 countries. The chief executive officer is "
            "Miriam Okafor, who joined the company in 2009 and has led it since March 2018.",
        ],
        None,
    ),
    (
        "Letter from the Chief Executive",
        [
            "Dear shareholders, 2023 was the year Harbor Light outgrew its single workshop. In "
            "September we opened our second factory, in the river town of Halden, which doubles our "
            "capacity for glass chimneys and lets us assemble solar lanterns in house for the first time.",
            "Demand for the Beacon 7 storm lantern stayed strong all year, and the Tidewater solar "
            "lantern, launched in June, sold beyond our plans. We also faced a hard spring: the price "
            "of brass rose by roughly a fifth between February and May, and we chose not to pass the "
            "whole increase to our customers. Gross margin therefore fell from 41.5 percent to 39.8 percent.",
            "I want to thank the 412 people of Harbor Light, and in particular the Halden team, who "
            "shipped their first lantern only nine weeks after the building was handed over. "
            "The board proposes a dividend of $0.42 per share, up from $0.38 last year.",
            "Miriam Okafor, Chief Executive Officer, Port Alder, 12 February 2024",
        ],
        None,
    ),
    (
        "Financial Results by Quarter",
        [
            "Revenue grew in every quarter but the last. The third quarter was the strongest in the "
            "company's history: Q3 revenue was $5.87 million, helped by the first full quarter of "
            "Tidewater sales and by early orders from hardware chains ahead of the autumn storm season.",
            "Fourth-quarter revenue of $5.83 million was slightly below the third quarter because the "
            "Halden start-up costs and a two-week shutdown of the Port Alder kiln for relining reduced output.",
            "Net income for the year was $1.93 million, compared with $1.71 million in 2022. Cash at "
            "year end was $3.2 million after investing $4.6 million in the Halden factory.",
        ],
        [
            ["Quarter", "Revenue ($M)", "Gross margin", "Units shipped"],
            ["Q1 2023", "4.60", "40.9%", "61,200"],
            ["Q2 2023", "5.10", "38.7%", "66,900"],
            ["Q3 2023", "5.87", "39.6%", "74,300"],
            ["Q4 2023", "5.83", "40.1%", "72,800"],
            ["Full year", "21.40", "39.8%", "275,200"],
        ],
    ),
    (
        "Products",
        [
            "The Beacon 7 storm lantern remains our best seller, with 38,000 units sold in 2023. It "
            "burns paraffin for up to 30 hours on one filling, has a hand-blown glass chimney and a "
            "solid brass frame, and retails for $64.",
            "The Tidewater solar lantern was launched on 6 June 2023 at a price of $89. A 2.5-watt "
            "panel in the lid charges a lithium iron phosphate battery that runs the lamp for 14 hours "
            "at its low setting. By year end 21,500 Tidewater lanterns had been sold.",
            "The Driftwood desk lamp, made with oak from local sawmills, sold 9,800 units. The older "
            "Keeper hurricane lamp was discontinued in November 2023 after 31 years in production.",
            "Product returns were 1.1 percent of units shipped, the lowest rate we have recorded.",
        ],
        None,
    ),
    (
        "Operations and Facilities",
        [
            "The Port Alder factory covers 12,000 square metres and houses the glass studio, the brass "
            "shop and final assembly. Its kiln was relined in October 2023, the first relining since 2011.",
            "The Halden factory opened on 14 September 2023. It covers 7,500 square metres, employs 96 "
            "people and makes glass chimneys and solar lanterns. Halden was chosen for its rail link to "
            "the port of Kessing and for a local training college with a glass-working programme.",
            "Glass batch materials come from Verrion Glassworks; brass sheet and tube come from two "
            "suppliers so that no single mill provides more than 60 percent of our brass. Average "
            "lead time from order to shipment fell from 11 days to 8 days during the year.",
        ],
        None,
    ),
    (
        "People",
        [
            "Harbor Light employed 412 people on 31 December 2023, compared with 318 a year earlier. "
            "Employee turnover was 7.4 percent. Staff completed 18,300 hours of training, most of it "
            "in glass work and in the new solar assembly line.",
            "There were two recordable safety incidents in 2023, both minor burns in the glass studio, "
            "against five in 2022. Every employee received the annual profit share of 3 percent of salary.",
        ],
        [
            ["Department", "Employees"],
            ["Glass studio", "118"],
            ["Brass and metal shop", "86"],
            ["Assembly and packing", "104"],
            ["Design and engineering", "27"],
            ["Sales and service", "44"],
            ["Administration", "33"],
            ["Total", "412"],
        ],
    ),
    (
        "Sustainability",
        [
            "In 2023, 61 percent of the electricity we used came from renewable sources, up from 48 "
            "percent, mainly thanks to the rooftop solar array installed in Halden. Recycled brass "
            "made up 44 percent of the brass we bought.",
            "Our kilns are the largest source of our emissions. We have committed to reaching net zero "
            "emissions by 2035, and we plan to replace the Port Alder gas kiln with an electric one in 2026.",
            "Through the lantern take-back scheme, customers returned 2,700 old lanterns; 93 percent of "
            "their material by weight was recycled.",
        ],
        None,
    ),
    (
        "Risks and Outlook for 2024",
        [
            "The main risks to our results are the price of brass, the cost of sea freight to our "
            "European customers, and the supply of lithium iron phosphate cells for the Tidewater lantern.",
            "For 2024 we expect revenue between $23 million and $24 million, and capital spending of "
            "about $1.5 million. We plan to launch a larger solar lantern, the Tidewater Max, in spring 2024.",
            "The annual general meeting will be held at the Port Alder works on 18 April 2024 at 10:00.",
        ],
        None,
    ),
    (
        "Board of Directors and Glossary",
        [
            "The board has five members: Helena Brandt (chair since 2020), Miriam Okafor (chief "
            "executive), Samuel Reyes (chief financial officer), Ingrid Solberg and Daniel Achterberg "
            "(independent directors). The board met eight times in 2023.",
            "Glossary. Chimney: the glass cylinder that shields a lantern's flame from wind. Relining: "
            "replacing the heat-resistant inner wall of a kiln. Gross margin: revenue minus the cost of "
            "goods sold, as a share of revenue. Recordable incident: a workplace injury that needs "
            "treatment beyond first aid.",
        ],
        None,
    ),
]


def _table(rows: list[list[str]]) -> Table:
    table = Table(rows, hAlign="LEFT")
    table.setStyle(
        TableStyle(
            [
                ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold"),
                ("GRID", (0, 0), (-1, -1), 0.5, colors.grey),
                ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
            ]
        )
    )
    return table


def _footer(canvas, doc) -> None:  # type: ignore[no-untyped-def]
    canvas.setFont("Helvetica", 8)
    canvas.drawString(2 * cm, 1.2 * cm, f"Harbor Light Lantern Company - Annual Report 2023 - page {doc.page}")


def build(out: Path = OUT) -> Path:
    styles = getSampleStyleSheet()
    story = []
    for index, (title, paragraphs, rows) in enumerate(SECTIONS):
        if index:
            story.append(PageBreak())
        story.append(Paragraph(title, styles["Title" if index == 0 else "Heading1"]))
        for text in paragraphs:
            story.append(Paragraph(text, styles["BodyText"]))
            story.append(Spacer(1, 0.3 * cm))
        if rows:
            story.append(_table(rows))
    # invariant=1: no timestamps or random IDs, so rebuilding gives the same bytes
    doc = SimpleDocTemplate(str(out), pagesize=A4, title="Harbor Light Annual Report 2023",
                            author="ktcli sample (CC0)", invariant=1)
    doc.build(story, onFirstPage=_footer, onLaterPages=_footer)
    return out


if __name__ == "__main__":
    print(build())
