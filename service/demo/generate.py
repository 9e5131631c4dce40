"""Writes ``workload.json``, the demo's bundled workload: the memories of a made-up persona and
questions about them, each with the memory that answers it.

Everything is synthetic and deterministic (no randomness beyond a seeded shuffle), so the file
is reproducible: ``python -m service.demo.generate`` rewrites it byte for byte, and a test
checks that the committed file is what this module writes. Each topic has ten facts built from
one sentence pattern, and a question per fact that names what only that fact says (a race, a
book, a plant), so its answer is known; standing facts that bear on every question of the
topic (a weak knee, on every race); and asides: small talk about the topic and lines of an
agent's tool log naming what a question names, which semantic search ranks high and a judge
scores 0. Generic small talk fills the rest, as it fills a real agent's memory.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from string import Formatter

from service.demo.workload import (
    ASIDE,
    FACT,
    SMALL_TALK_TOPIC,
    STANDING,
    WORKLOAD_PATH,
    Memory,
    Question,
)

PERSONA = "Mara Lindqvist"
#: The seed of the shuffles that interleave topics; any fixed value would do.
SEED = 7
#: Small-talk memories, which no question is about.
SMALL_TALK = 36
FIRST_DAY = date(2023, 1, 2)


@dataclass(frozen=True)
class Topic:
    """One part of the persona's life: a fact and a question about it for each row of ``rows``
    (``fact`` and ``question`` filled with the row), what holds for every question of the topic
    (``standing``), and what small talk about the topic mentions (``mentions``)."""

    name: str
    fact: str
    question: str
    rows: tuple[tuple[str, ...], ...]
    standing: tuple[str, ...]
    mentions: tuple[str, ...]  # what small talk about the topic is about


TOPICS = (
    Topic(
        "running", "Mara ran the {0} in {1}, {2}.",
        "What was Mara's time in the {0}?",
        (("Lisbon half marathon", "1:52:10", "her best so far"),
         ("Stockholm 10k", "48:30", "in pouring rain"),
         ("Berlin marathon", "4:05:44", "with cramps after 30 km"),
         ("Malmo trail race", "2:20:05", "mostly walking the hills"),
         ("Oslo 5k", "23:12", "pushing a friend's pram"),
         ("Copenhagen half marathon", "1:49:58", "a new personal record"),
         ("Gothenburg relay", "41:02", "as the last runner of her team"),
         ("Uppsala night run", "55:40", "with a head torch"),
         ("Helsinki 10k", "50:01", "just after a cold"),
         ("Bergen mountain race", "3:10:15", "finishing in fog")),
        ("Mara has a weak left knee and tapes it before every long run.",
         "Mara trains with the Tuesday running club by the river.",
         "Mara keeps every race time in a notebook by her bed."),
        ("her running", "the next race", "her running shoes",
         "the running club", "her training plan"),
    ),
    Topic(
        "books", "Mara finished reading '{0}' by {1} and called it {2}.",
        "What did Mara think of the book '{0}'?",
        (("The Salt Road", "Ines Vale", "slow but beautiful"),
         ("Winter Orchard", "Tomas Berg", "the best novel of her year"),
         ("Paper Lanterns", "Aiko Mori", "too sentimental"),
         ("The Cartographer's Daughter", "Lena Fisk", "gripping until the last page"),
         ("Quiet Engines", "Paul Adair", "a useful book about focus"),
         ("North of Nowhere", "Sanna Koski", "funny and sad at once"),
         ("Glass Harbour", "Omar Haddad", "confusing in the middle"),
         ("The Beekeeper's Year", "Ruth Ellery", "calming before bed"),
         ("Iron and Ivy", "Dana Kwon", "a page-turner"),
         ("Small Gods of Tuesday", "Felix Orr", "overrated")),
        ("Mara reads mostly on the morning train to work.",
         "Mara's book club meets on the first Thursday of each month.",
         "Mara writes a short review of every book she finishes on her blog."),
        ("her reading", "the book club", "the novel on her nightstand",
         "the library", "her reading list"),
    ),
    Topic(
        "cooking", "Mara cooked {0} for {1}, {2}.",
        "Who did Mara cook {0} for?",
        (("saffron risotto", "her sister Elin", "who asked for seconds"),
         ("lamb tagine", "her book club", "using her grandmother's spices"),
         ("mushroom pie", "her neighbours", "after foraging in the woods"),
         ("fish soup", "her father", "on his seventieth birthday"),
         ("vegetable curry", "her running group", "in a huge pot"),
         ("cinnamon buns", "her colleagues", "for a Friday treat"),
         ("beef stew", "her friend Jonas", "who had just moved house"),
         ("lemon tart", "her cello teacher", "as a thank-you"),
         ("pumpkin soup", "the neighbour's children", "at Halloween"),
         ("paella", "her cousins from Valencia", "who judged it kindly")),
        ("Mara is allergic to peanuts, so she never cooks with them.",
         "Mara does not eat pork.",
         "Mara cooks everything in her grandmother's cast-iron pan."),
        ("cooking", "dinner", "the kitchen", "her recipes", "the weekly food shop"),
    ),
    Topic(
        "pepper", "Mara's dog Pepper {0} {1}.",
        "What happened with Pepper {1}?",
        (("chewed through a sofa cushion", "on the first day of the new year"),
         ("learned to open the garden gate", "during the spring holiday"),
         ("got stung by a wasp on the nose", "at the lake picnic"),
         ("won a rosette for obedience", "at the town dog show"),
         ("had two teeth removed", "at the vet's in August"),
         ("ran off after a deer", "on the forest walk in October"),
         ("met a hedgehog and barked all night", "after the garden party"),
         ("was terrified of the fireworks", "on New Year's Eve"),
         ("swam across the river", "on the canoe trip"),
         ("stole a whole roast chicken", "at the Christmas dinner")),
        ("Pepper is a four-year-old border collie Mara adopted from a shelter.",
         "Pepper is insured with a pet insurer that pays most vet bills.",
         "Mara's neighbour Jonas looks after Pepper when Mara is away."),
        ("Pepper", "the dog's walks", "Pepper's food", "the dog", "Pepper's training"),
    ),
    Topic(
        "work", "At the bicycle company Mara led the {0} project, which {1}.",
        "How did Mara's {0} project go?",
        (("cargo bike app", "shipped two weeks late"),
         ("battery monitoring", "cut warranty claims by a third"),
         ("dealer portal", "was cancelled after six months"),
         ("frame stress testing", "found a welding defect before launch"),
         ("route planner", "won an internal award"),
         ("inventory forecasting", "saved the warehouse a full shift"),
         ("rental fleet tracking", "went live in three cities"),
         ("customer chat bot", "was rolled back after complaints"),
         ("e-bike firmware update", "bricked forty bikes on the first night"),
         ("sustainability report", "was quoted by a national newspaper")),
        ("Mara has worked at the bicycle company in Malmo since 2019.",
         "Mara's manager at the bicycle company is called Petra.",
         "Mara's team at work has six engineers and one designer."),
        ("work", "the office", "her project at work", "her manager", "the team meeting"),
    ),
    Topic(
        "garden", "Mara planted {0} {1}, and {2}.",
        "Where did Mara plant {0}?",
        (("tomatoes", "in the greenhouse", "they ripened in July"),
         ("garlic", "along the south fence", "the crop was tiny"),
         ("sunflowers", "by the shed", "the birds ate every seed"),
         ("blueberry bushes", "in acid soil near the pond", "they fruited in the second year"),
         ("potatoes", "in sacks on the patio", "the harvest filled two buckets"),
         ("rhubarb", "in the corner bed", "she made jam from it"),
         ("tulip bulbs", "under the kitchen window", "they flowered in April"),
         ("an apple tree", "in the middle of the lawn", "it needed staking"),
         ("basil", "on the balcony", "slugs found it anyway"),
         ("lavender", "beside the front path", "the bees loved it")),
        ("Mara's allotment garden has heavy clay soil.",
         "Mara composts all her kitchen scraps for the allotment.",
         "Mara's allotment is a short cycle ride from her flat."),
        ("the garden", "the allotment", "her plants", "the vegetable beds", "the weeds"),
    ),
    Topic(
        "music", "Mara practised {0} on the cello for {1} before {2}.",
        "How long did Mara practise {0}?",
        (("the Bach prelude in G", "six weeks", "the spring recital"),
         ("Saint-Saens' The Swan", "three weeks", "her cousin's wedding"),
         ("a Faure elegy", "two months", "the conservatory audition"),
         ("the Dvorak concerto's first movement", "four months", "the orchestra trial"),
         ("a folk medley", "ten days", "the midsummer party"),
         ("Elgar's Salut d'Amour", "a fortnight", "her parents' anniversary"),
         ("a Vivaldi sonata", "five weeks", "the church concert"),
         ("the Boccherini minuet", "one week", "the school visit"),
         ("a film score arrangement", "three months", "the charity gala"),
         ("a Piazzolla tango", "seven weeks", "the jazz club night")),
        ("Mara has played the cello since she was nine.",
         "Mara's cello teacher is called Mr Ahlberg.",
         "Mara plays in an amateur orchestra on Sunday evenings."),
        ("her cello", "cello practice", "the orchestra", "the next concert", "her music"),
    ),
    Topic(
        "travel", "In {0} Mara travelled to {1} to {2}.",
        "When did Mara travel to {1}?",
        (("March 2023", "Kyoto", "see the cherry blossom"),
         ("June 2023", "Reykjavik", "hike to the hot springs"),
         ("September 2023", "Lisbon", "run the half marathon"),
         ("December 2023", "Vienna", "hear a New Year concert"),
         ("February 2024", "Tromso", "watch the northern lights"),
         ("May 2024", "Valencia", "visit her cousins"),
         ("July 2024", "Edinburgh", "go to the festival"),
         ("October 2024", "Marrakesh", "learn to cook tagine"),
         ("January 2025", "Zermatt", "ski with her brother"),
         ("April 2025", "Istanbul", "give a talk on cargo bikes")),
        ("Mara takes the train rather than flying whenever she can.",
         "Mara keeps a travel journal with her tickets glued in.",
         "Mara's passport expires in 2027."),
        ("travelling", "her next trip", "the trains", "her holiday plans", "packing"),
    ),
)

#: How small talk goes on about a topic's mentions: it says nothing of them, however alike it
#: sounds to a question about them.
SMALL_TALK_ABOUT = (
    "Mara said she would think about {0} later.",
    "Mara sighed that {0} was on her mind again.",
    "Mara asked to talk about {0} another day.",
    "Mara joked that {0} would have to wait.",
    "Mara said she was too tired to think about {0}.",
    "Mara mentioned {0} in passing and changed the subject.",
)
#: What an agent's tools log about a thing: it names the thing and says nothing of it.
TOOL_LOGS = (
    "Tool log: web search for '{0}' returned 12 results.",
    "Tool log: calendar lookup for '{0}' found no entries.",
    "Tool log: reminder mentioning '{0}' was dismissed.",
    "Tool log: note titled '{0}' was synced to the phone.",
    "Tool log: email search for '{0}' timed out.",
)

SMALL_TALK_LINES = (
    "Mara said good morning and asked how the weekend had been.",
    "Mara mentioned she was tired after a long day.",
    "Mara laughed at a joke about Mondays.",
    "Mara said the coffee at the office was terrible again.",
    "Mara complained about the weather.",
    "Mara said she would call back later.",
    "Mara asked for a reminder to buy milk.",
    "Mara said thanks and signed off for the night.",
    "Mara wondered aloud what to have for lunch.",
    "Mara said the bus was late this morning.",
    "Mara noted that her phone battery was dying.",
    "Mara asked what day of the week it was.",
)


def _small_talk_about(topic: Topic) -> list[str]:
    """A line of small talk about each of ``topic``'s mentions, the lines taking turns so that
    each topic's small talk sounds like every other's."""
    return [
        SMALL_TALK_ABOUT[number % len(SMALL_TALK_ABOUT)].format(mention)
        for number, mention in enumerate(topic.mentions)
    ]


def _tool_logs(topic: Topic) -> list[str]:
    """A line of an agent's tool log per fact of ``topic``, naming what its question names."""
    named = next(int(field) for _, field, _, _ in Formatter().parse(topic.question) if field)
    return [
        TOOL_LOGS[row % len(TOOL_LOGS)].format(values[named])
        for row, values in enumerate(topic.rows)
    ]


def _entries() -> list[tuple[str, str, str, int | None]]:
    """(text, topic, kind, row) of every memory; the row of a fact, None for the others."""
    entries: list[tuple[str, str, str, int | None]] = []
    for topic in TOPICS:
        entries += [
            (topic.fact.format(*values), topic.name, FACT, row)
            for row, values in enumerate(topic.rows)
        ]
        entries += [(text, topic.name, STANDING, None) for text in topic.standing]
        entries += [(text, topic.name, ASIDE, None) for text in _small_talk_about(topic)]
        entries += [(text, topic.name, ASIDE, None) for text in _tool_logs(topic)]
    entries += [
        (SMALL_TALK_LINES[n % len(SMALL_TALK_LINES)], SMALL_TALK_TOPIC, ASIDE, None)
        for n in range(SMALL_TALK)
    ]
    return entries


def _memories(rng: random.Random) -> tuple[list[Memory], dict[tuple[str, int], str]]:
    """The memories in the order they happened, and the external_id of each fact by (topic,
    row)."""
    entries = _entries()
    rng.shuffle(entries)
    memories: list[Memory] = []
    ids: dict[tuple[str, int], str] = {}
    for number, (text, topic, kind, row) in enumerate(entries):
        day = FIRST_DAY + timedelta(days=4 * number)
        external_id = f"m{number:03d}"
        if topic == SMALL_TALK_TOPIC:
            # Small talk repeats its lines: the day keeps each memory's text its own.
            text = f"On {day:%d %B %Y}: {text}"
        if row is not None:
            ids[(topic, row)] = external_id
        memories.append(Memory(external_id, text, f"{day.isoformat()}T09:00:00Z", topic, kind))
    return memories, ids


def _questions(rng: random.Random, ids: dict[tuple[str, int], str]) -> list[Question]:
    """A question per fact, the topics interleaved."""
    questions = [
        Question(topic.question.format(*values), topic.name, ids[(topic.name, row)])
        for topic in TOPICS
        for row, values in enumerate(topic.rows)
    ]
    rng.shuffle(questions)
    return questions


def workload() -> dict[str, object]:
    """The workload as written to :data:`WORKLOAD_PATH`."""
    rng = random.Random(SEED)
    memories, ids = _memories(rng)
    return {
        "persona": PERSONA,
        "about": "Synthetic: a made-up persona's memories and questions about them, written by "
        "service/demo/generate.py. A question's answer is the external_id of the memory that "
        "answers it; a memory's kind says how it bears on its topic's questions (see "
        "service/demo/workload.py).",
        "memories": [asdict(memory) for memory in memories],
        "questions": [asdict(question) for question in _questions(rng, ids)],
    }


def render() -> str:
    """The text of :data:`WORKLOAD_PATH`."""
    return json.dumps(workload(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    WORKLOAD_PATH.write_text(render(), encoding="utf-8")
