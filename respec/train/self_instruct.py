"""Self-instruct prompt sources for head training: prompts the target model writes itself.

No benchmark text is involved: everything starts from the hand-written seed lists below (topics,
people, events, task templates) and grows through the target's own greedy answers, in two stages.

Stage 1, `seed_prompts()`: (category, text) prompts built from the seeds. Some are answered for
their own sake (writing, role-play, reasoning, explanation, extraction, code); others ask the model
to *write material*: a question someone might ask, a short news article, a math word problem, a
few sentences in German. Every answer, of either kind, is a self-distilled training response.

Stage 2, `derived_prompts(records, decode)`: prompts built from stage-1 answers (records of the
response store, `decode` turns response ids into text): the written questions are asked; articles are
wrapped in summarise / headline / extract / answer / translate tasks and in multi-document
"answer from the documents" prompts; word problems are solved step by step; German text is
translated into English; and some stage-1 conversations get a second user turn (multi-turn
continuations, as message lists). Deterministic for the same records.

Contract: both return lists of `(category, prompt)` where prompt is a string or a message list;
stage-1 prompts carry the category prefix "si1-" and derived ones "si2-" so stage-2 can find its
material by category.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

TOPICS = [
    "the water cycle", "vaccines", "black holes", "the French Revolution", "photosynthesis", "inflation",
    "the printing press", "jet engines", "coral reefs", "the Roman Republic", "neural networks", "antibiotics",
    "plate tectonics", "the telegraph", "wind power", "dreams", "index funds", "the Silk Road", "DNS",
    "volcanoes", "natural selection", "nutrition labels", "Mars exploration", "elections", "tea",
    "the steam engine", "batteries", "ants", "the Olympic Games", "the aurora borealis", "procrastination",
    "bilingual children", "public libraries", "composting", "the Apollo program", "tsunamis", "plastic waste",
    "jazz", "the game of go", "glaciers", "the immune system", "supply and demand", "the Renaissance",
    "quantum computers", "3D printing", "bread baking", "urban gardens", "migratory birds", "the Internet of Things",
    "the Cold War", "ancient Egypt", "the periodic table", "credit scores", "remote work", "sleep",
    "cryptography", "the Amazon rainforest", "earthquake-resistant buildings", "the human heart", "opera",
    "minimalism", "self-driving cars", "the metric system", "the moon's phases", "desert ecosystems",
    "social media", "the Great Depression", "microplastics", "honey production", "marathon training",
    "the camera obscura", "tides", "solar panels", "the Byzantine Empire", "open-source software",
    "the placebo effect", "chocolate", "carbon capture", "the history of maps", "sign language",
    "bridges", "the circulatory system", "volunteering", "Shakespeare's plays", "electric guitars",
    "the stock exchange", "the Industrial Revolution", "rainforest frogs", "urban planning", "wildfires",
    "the Hubble telescope", "cheese making", "the Wright brothers", "ocean currents", "recycling glass",
    "meditation", "the Mongol Empire", "seed banks", "video game design", "public transport", "sourdough",
    "the Enlightenment", "submarines", "cloud computing", "chess openings", "the Great Barrier Reef",
]
PEOPLE = ["a student", "a teacher", "a nurse", "a small-business owner", "a retired engineer", "a journalist",
          "a parent", "a software developer", "a farmer", "a tourist", "a scientist", "a historian"]
EVENTS = [
    "a town opening a new public library", "a company recalling a faulty phone charger",
    "a heatwave breaking temperature records", "a local team winning a championship",
    "scientists finding a new species of beetle", "a city introducing free buses",
    "a museum returning stolen artworks", "a hospital opening a new children's ward",
    "a bridge closing for repairs", "a school starting a coding club", "a storm cutting power to thousands",
    "a startup raising money for electric scooters", "a village festival celebrating its harvest",
    "a court ruling on a noise complaint", "a rescue of hikers lost in the mountains",
    "a new train line between two cities", "a chef opening a zero-waste restaurant",
    "a study on teenagers and sleep", "a factory switching to solar power", "a marathon with a record turnout",
    "a rare comet visible in the night sky", "a farmers' market moving to a new square",
    "a university launching free online courses", "an airline changing its baggage rules",
    "a river cleanup by volunteers", "a zoo welcoming twin panda cubs", "a bank closing branches",
    "a drought affecting wheat prices", "a film festival announcing its winners", "a data breach at a retailer",
    "a city banning cars from its centre on Sundays", "an archaeologist uncovering a Roman villa",
    "a smartphone maker launching a repairable phone", "a strike by train drivers",
    "a record year for a national park", "a new law on recycling packaging", "a robot helping in a warehouse",
    "a power plant being turned into a museum", "a volcano erupting near a small island",
    "a library lending tools instead of books",
]
SCENARIOS = ["a bakery", "a school trip", "a garden", "a bike ride", "a bookshop", "a train journey",
             "saving pocket money", "a football tournament", "painting a fence", "a recipe for pancakes",
             "a parking garage", "a water tank", "a phone plan", "a classroom", "a farm with animals",
             "a concert ticket sale", "a road trip", "a library fine", "mixing paint", "a running race"]
FORMS = ["a short poem", "a persuasive paragraph", "a product description", "a short story opening",
         "a formal email", "a speech introduction", "a travel blog paragraph", "a restaurant review",
         "a motivational message", "a diary entry", "a job advertisement", "a FAQ with three entries"]
ROLES = ["a ship captain", "a medieval knight", "a museum guide", "a personal trainer", "a detective",
         "a tour guide in Rome", "a customer support agent", "a science teacher", "a chef", "an astronaut"]
CODE_TASKS = [
    "parses a date string and returns the weekday", "counts the lines of a file", "implements a queue with two stacks",
    "checks balanced brackets", "computes a moving average", "converts a Roman numeral to an integer",
    "finds all primes below n", "merges overlapping intervals", "reads a CSV file and sums one column",
    "validates a password's strength", "computes the edit distance of two strings", "implements binary search",
    "returns the k most common words", "flattens a dictionary of dictionaries", "caches a function's results",
    "rotates a matrix by 90 degrees", "generates all permutations of a list", "finds the longest common prefix",
    "implements a linked list with insert and delete", "converts a number to binary",
]
CODE_LANGS = ["Python", "JavaScript", "C++", "Java", "Go", "TypeScript", "Rust", "SQL"]
REASONING = [
    "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",
    "A bat and a ball cost 1.10 dollars in total. The bat costs one dollar more than the ball. How much does the ball cost?",
    "There are three boxes: one has apples, one has oranges, one has both. All labels are wrong. You may pick one fruit from one box. How do you relabel them?",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain.",
    "If you overtake the person in second place in a race, what position are you in?",
    "Tom is taller than Ana. Ana is taller than Luis. Who is the shortest?",
    "A farmer has 17 sheep and all but 9 run away. How many are left?",
    "What comes next in the sequence 2, 6, 12, 20, 30?",
    "Two trains leave stations 300 km apart, driving toward each other at 70 and 80 km/h. When do they meet?",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long do 100 machines take to make 100 widgets?",
]
_STAGE1_MATERIAL = {
    "si1-question": "Write one question that {who} might ask about {topic}. Reply with the question only.",
    "si1-article": "Write a short news article, about 150 words, about {event}. Include names, places and numbers.",
    "si1-problem": "Write a math word problem about {scenario} that takes two or three steps to solve. "
                   "Reply with the problem only, without the solution.",
    "si1-german": "Write three simple sentences in German about {topic}.",
}
_ARTICLE_TASKS = [
    ("summarization", "Summarize the following article in two or three sentences.\n\n{a}"),
    ("summarization", "{a}\n\nTL;DR:"),
    ("summarization", "Write a headline and a one-sentence summary for this news story:\n\n{a}"),
    ("extraction", "Extract every person, place, organisation and number mentioned in the text below, "
                   "as a bulleted list.\n\n{a}"),
    ("qa", "{a}\n\nAccording to the article, what happened, and why does it matter?"),
    ("translation", "Translate the first two sentences of this article into French:\n\n{a}"),
    ("summarization", "Rewrite the following article for a ten-year-old reader.\n\n{a}"),
    ("extraction", "Read the article and answer in JSON with the keys \"who\", \"what\", \"where\" and "
                   "\"when\".\n\n{a}"),
]
_FOLLOW_UPS = ["Can you make that shorter?", "Can you give an example?", "Explain that in simpler words.",
               "What would be a common mistake here?", "Can you add one more point?",
               "Now write it as a numbered list.", "Why is that important?", "Can you say it more formally?"]


# a second seed set, drawn with its own random stream so that adding it left the first set's prompts
# (and so the responses already stored for them) unchanged
TOPICS_2 = [
    "the history of writing", "lighthouses", "fermentation", "the Ottoman Empire", "typography", "bees and pollination",
    "hydrogen fuel", "the Great Fire of London", "password managers", "the violin", "river deltas", "dinosaurs",
    "paper money", "the Panama Canal", "vertical farming", "the human eye", "origami", "volunteer firefighters",
    "the Hanseatic League", "spreadsheets", "hurricanes", "the Maya civilisation", "public parks", "robot vacuum cleaners",
    "the speed of light", "knitting", "the Berlin Wall", "e-books", "snow leopards", "container shipping",
    "the printing of newspapers", "caves", "the Moon's craters", "electric bicycles", "chess computers", "olive oil",
    "the Vikings", "noise pollution", "smart watches", "the ozone layer", "penguins", "the postal service",
    "ancient Greek theatre", "rainwater harvesting", "podcasts", "the Sahara", "street food", "the Suez Canal",
    "antibiotic resistance", "the harp", "hot air balloons", "the Inca road system", "bonsai trees", "GPS",
    "the human skeleton", "board games", "tap water treatment", "the Mughal Empire", "kites", "wetlands",
]
EVENTS_2 = [
    "a city planting ten thousand trees", "a ferry service resuming after a storm", "a teenager winning a science fair",
    "a supermarket chain ending plastic bags", "a landslide closing a mountain road", "a library's 100th birthday",
    "a hospital trialling robot-assisted surgery", "a town electing its youngest mayor", "a bakery's bread price rising",
    "a power cut during a football final", "an orchestra touring small villages", "a new cycle path along a canal",
    "a heat pump subsidy for homeowners", "a dog rescued from a frozen lake", "a school replacing exams with projects",
    "a port expanding to take larger ships", "a shortage of bus drivers", "an old cinema reopening",
    "a record apple harvest", "an island banning cars", "a bookshop run by volunteers", "a spike in bicycle thefts",
    "a new vaccine campaign for children", "a flood barrier being tested", "a chess prodigy beating a grandmaster",
    "a wind farm off the coast", "a village getting fast internet", "a bridge painted by local artists",
    "a company moving to a four-day week", "a lost wallet returned after ten years", "a rare bird returning to a marsh",
    "a city council approving a new stadium", "a cyberattack on a town hall", "a cooking contest for amateurs",
    "a museum exhibition on ancient coins", "a train derailment without injuries", "a beach cleanup after a storm",
    "a hospital's new maternity ward", "a market for second-hand clothes", "a drone delivering medicine to an island",
]
SCENARIOS_2 = ["a swimming pool", "a pizza order", "a bus timetable", "a savings account", "a school library",
               "a fruit stall", "a cinema", "a marathon training plan", "a fish tank", "a birthday party"]


_ARTICLE_STYLES = ("", " Write it in a neutral tone.", " Start with the most important fact.",
                   " Quote one person involved.", " End with what happens next.")


def _article_prompts(events: Sequence[str]) -> list[tuple[str, str]]:
    return [("si1-article", _STAGE1_MATERIAL["si1-article"].format(event=e) + style)
            for e in events for style in _ARTICLE_STYLES]


def _second_seed_set(rng: random.Random) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for topic in TOPICS_2:
        for who in rng.sample(PEOPLE, 6):
            out.append(("si1-question", _STAGE1_MATERIAL["si1-question"].format(who=who, topic=topic)))
        out.append(("si1-german", _STAGE1_MATERIAL["si1-german"].format(topic=topic)))
        out.append(("si1-writing", f"Write {rng.choice(FORMS)} about {topic}."))
        out.append(("si1-roleplay", f"Pretend you are {rng.choice(ROLES)}. Explain {topic} to a visitor."))
        out.append(("si1-stem", f"What are the most important facts to know about {topic}? Explain each briefly."))
        out.append(("si1-humanities", f"Describe the history of {topic} and its influence on everyday life."))
    out += _article_prompts(EVENTS_2)
    for scenario in SCENARIOS_2:
        for _ in range(10):
            out.append(("si1-problem", _numbered(_STAGE1_MATERIAL["si1-problem"].format(scenario=scenario), rng)))
    return out


def seed_prompts(seed: int = 0) -> list[tuple[str, str]]:
    """Stage 1: material-writing prompts (category "si1-<kind>") and directly answered tasks
    ("si1-<category>"); deterministic. Two seed sets, each with its own random stream."""
    first = _first_seed_set(random.Random(seed))
    seen = {t for _, t in first}
    out = list(first)
    for c, t in _second_seed_set(random.Random(seed + 1)):
        if t not in seen:                   # a problem prompt can repeat (same scenario and number)
            seen.add(t)
            out.append((c, t))
    return out


def _first_seed_set(rng: random.Random) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for topic in TOPICS:
        for who in rng.sample(PEOPLE, 6):
            out.append(("si1-question", _STAGE1_MATERIAL["si1-question"].format(who=who, topic=topic)))
        out.append(("si1-german", _STAGE1_MATERIAL["si1-german"].format(topic=topic)))
        for form in rng.sample(FORMS, 2):
            out.append(("si1-writing", f"Write {form} about {topic}."))
        role = rng.choice(ROLES)
        out.append(("si1-roleplay", f"Pretend you are {role}. Tell me about {topic} in your own voice."))
        out.append(("si1-stem", f"Explain how {topic} works, step by step, for a curious adult."))
        out.append(("si1-humanities", f"What role has {topic} played in society, and how might that change?"))
    out += _article_prompts(EVENTS)
    for scenario in SCENARIOS:
        for _ in range(6):
            out.append(("si1-problem", _STAGE1_MATERIAL["si1-problem"].format(scenario=scenario)))
    # repeated problem prompts are identical text: vary them with a number the model must use
    out = _dedupe_problems(out, rng)
    for task in CODE_TASKS:
        for lang in rng.sample(CODE_LANGS, 3):
            out.append(("si1-coding", f"Write a {lang} function that {task}, and explain how it works."))
    out += [("si1-reasoning", q) for q in REASONING]
    rng.shuffle(out)
    return out


def _numbered(problem_prompt: str, rng: random.Random) -> str:
    """A word-problem prompt that must use a drawn number (identical prompts differ by it)."""
    return problem_prompt.replace("two or three steps", f"two or three steps and uses the number {rng.randint(3, 95)}")


def _dedupe_problems(items: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    for c, t in items:
        if c == "si1-problem":
            t = _numbered(t, rng)
        if t not in seen:
            seen.add(t)
            out.append((c, t))
    return out


def _clean(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()


Prompt = str | list[dict[str, str]]


def derived_prompts(records: Sequence[dict], decode: Callable[[Sequence[int]], str], *, seed: int = 0,
                    max_chars: int = 2400) -> list[tuple[str, Prompt]]:
    """Stage 2 from stored stage-1 records (fields "category", "prompt_text", "response_ids")."""
    rng = random.Random(seed)
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        cat = r.get("category", "")
        if not cat.startswith("si1-") or not r.get("response_ids"):
            continue
        text = _clean(decode(r["response_ids"]))
        if 20 <= len(text) <= max_chars:
            by_kind.setdefault(cat, []).append((r.get("prompt_text", ""), text))
    out: list[tuple[str, Prompt]] = []
    for _, q in by_kind.get("si1-question", []):
        q = q.strip().strip('"')
        if q.endswith("?") and len(q) < 400:
            out.append(("si2-qa", q))
    articles = [a for _, a in by_kind.get("si1-article", [])]
    for a in articles:
        for j in rng.sample(range(len(_ARTICLE_TASKS)), 3):
            cat, tpl = _ARTICLE_TASKS[j]
            out.append((f"si2-{cat}", tpl.format(a=a)))
    for i in range(len(articles) // 2):
        docs = rng.sample(articles, min(3, len(articles)))
        head = docs[0].split(".")[0][:160]
        body = "\n\n".join(f"Document {k + 1}:\n{d}" for k, d in enumerate(docs))
        out.append(("si2-rag", f"Answer the question using only the documents below.\n\n{body}\n\n"
                               f"Question: What do the documents report about this: \"{head}\"?"))
    for _, p in by_kind.get("si1-problem", []):
        out.append(("si2-math_reasoning", f"{p}\n\nSolve the problem step by step and give the final answer."))
    for _, g in by_kind.get("si1-german", []):
        out.append(("si2-translation", f"Translate the following German text into English:\n\n{g}"))
    direct = [(p, a) for k in ("si1-writing", "si1-roleplay", "si1-stem", "si1-humanities", "si1-coding")
              for p, a in by_kind.get(k, [])]
    for p, a in rng.sample(direct, len(direct) // 2):
        if p:
            out.append(("si2-multiturn", [{"role": "user", "content": p}, {"role": "assistant", "content": a},
                                          {"role": "user", "content": rng.choice(_FOLLOW_UPS)}]))
    rng.shuffle(out)
    return out
