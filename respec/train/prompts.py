"""Prompt sets written by the project for self-distillation (the target answers them, the head
learns from its answers): chat, code, math, translation, and summarisation of text given in the
prompt. Everything is generated deterministically from small hand-written lists, so the same call
always returns the same prompts in the same order (and the same keys, which the response store
uses to skip prompts already answered).

Contract: `builtin_prompts()` -> list of (category, text), categories in CATEGORIES.
"""
from __future__ import annotations

import random

CATEGORIES = ("chat", "code", "math", "translation", "summarisation")

_CHAT_TOPICS = [
    "the water cycle", "how vaccines work", "black holes", "the French Revolution", "photosynthesis",
    "compound interest", "the history of the printing press", "how airplanes stay in the air",
    "climate change", "the Roman Empire", "machine learning", "the human immune system",
    "plate tectonics", "the invention of the telephone", "renewable energy", "sleep and memory",
    "the stock market", "the Great Wall of China", "how the internet works", "volcanoes",
    "the theory of evolution", "healthy eating", "the solar system", "democracy", "coffee",
    "the Industrial Revolution", "electric cars", "honey bees", "the Olympic Games", "rainbows",
    "time management", "learning a new language", "public speaking", "saving money", "gardening",
    "the Moon landing", "earthquakes", "recycling", "the piano", "chess",
]
_CHAT_TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t}.",
    "Give me a brief overview of {t}.",
    "What are the pros and cons of {t}?",
    "Write a haiku about {t}.",
    "Write a short blog post introduction about {t}.",
    "What is a common misconception about {t}?",
]
_ADVICE = [
    "How can I get better at focusing while I study?", "What should I pack for a weekend hiking trip?",
    "How do I write a polite email declining a job offer?", "Can you suggest a simple weekly workout plan?",
    "What are some good habits for a productive morning?", "How do I prepare for a job interview?",
    "Give me five ideas for a rainy-day activity with kids.", "How can I reduce my screen time?",
    "What is a good way to start learning to draw?", "Suggest a menu for a vegetarian dinner party.",
    "How do I make a budget for the month?", "What are tips for writing a good cover letter?",
    "Write a thank-you note to a teacher.", "Write a short story about a lost robot finding its way home.",
    "Write a limerick about a cat who loves cheese.", "Describe a sunset over the ocean in vivid detail.",
    "Write a product description for a reusable water bottle.", "Compose a friendly reminder message for a team meeting.",
    "Write a dialogue between a customer and a barista.", "Give me advice on keeping houseplants alive.",
]

_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "sorts a list of numbers using bubble sort", "counts the vowels in a string",
    "finds the largest element in a list", "checks whether a string is a palindrome",
    "merges two sorted lists into one sorted list", "computes the factorial of a number",
    "removes duplicates from a list while keeping the order", "converts Celsius to Fahrenheit",
    "counts how often each word appears in a text", "performs binary search on a sorted list",
    "computes the greatest common divisor of two numbers", "flattens a nested list",
    "checks whether two strings are anagrams", "returns the sum of the digits of an integer",
    "transposes a matrix given as a list of lists", "validates an email address with a simple rule",
    "finds the second largest number in a list", "rotates a list by k positions",
    "computes the running average of a list", "groups words by their first letter",
    "parses a CSV line into fields", "implements a simple stack class",
]
_CODE_LANGS = ["Python", "JavaScript", "C", "Java", "Rust", "Go"]
_CODE_EXTRA = [
    "Explain what a Python list comprehension is, with an example.",
    "What is the difference between a list and a tuple in Python?",
    "Explain recursion with a simple code example.",
    "What does the `git rebase` command do?",
    "Write a SQL query that selects the ten most recent orders from a table called orders.",
    "Explain the difference between `==` and `is` in Python.",
    "Write a bash one-liner that counts the lines in all .txt files in a folder.",
    "What is a hash table and why is lookup fast?",
    "Explain big-O notation with examples.",
    "Write a Python class representing a bank account with deposit and withdraw methods.",
    "Find the bug: `def add(a, b): return a - b`.",
    "Write a regular expression that matches a date in the form YYYY-MM-DD and explain it.",
]

_NAMES = ["Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas"]
_ITEMS = ["apples", "books", "pencils", "stickers", "marbles", "cookies", "stamps", "cards"]

_SENTENCES = [
    "The weather is beautiful today, so we are going to the park.",
    "Could you tell me where the nearest train station is?",
    "I have been learning to cook for three months.",
    "The museum opens at nine in the morning and closes at six.",
    "My brother works as a nurse in a large hospital.",
    "We should protect the forests for future generations.",
    "The meeting has been moved to Thursday afternoon.",
    "She reads a new book every week.",
    "Please turn off the lights when you leave the room.",
    "This restaurant serves the best soup in town.",
    "The children are playing football in the garden.",
    "I would like to book a table for two people tonight.",
    "Technology changes the way we communicate with each other.",
    "The river flows through the old part of the city.",
    "Thank you very much for your help yesterday.",
]
_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese"]
_FOREIGN = [
    ("German", "Der Zug nach Berlin hat heute leider eine Stunde Verspätung."),
    ("German", "Ich trinke jeden Morgen eine Tasse Kaffee mit Milch."),
    ("French", "Nous avons visité le musée du Louvre pendant nos vacances."),
    ("French", "Il fait très froid en hiver dans les montagnes."),
    ("Spanish", "Mi abuela prepara la mejor paella de toda la familia."),
    ("Spanish", "El concierto empezará a las ocho de la noche."),
    ("Italian", "La biblioteca è chiusa la domenica."),
    ("Portuguese", "Eu gosto de caminhar na praia ao pôr do sol."),
]

_PASSAGES = [
    "The city council met on Monday to discuss a proposal for a new bicycle lane along Main Street. "
    "Supporters argued that the lane would reduce traffic and improve safety for cyclists, while some "
    "shop owners worried that removing parking spaces would hurt their business. After two hours of "
    "debate, the council voted to run a six-month trial and to collect data on traffic and sales.",
    "Researchers at a university studied how sleep affects learning. Students who slept at least eight "
    "hours after studying remembered about twenty percent more words the next day than students who "
    "stayed awake. The researchers believe that sleep helps the brain move new memories into long-term "
    "storage, and they recommend that students avoid studying all night before an exam.",
    "The company announced that its quarterly revenue grew by twelve percent, driven mainly by strong "
    "sales of its new smartphone. However, profits fell slightly because of higher costs for components "
    "and shipping. The chief executive said the company would focus on reducing costs next year and "
    "would open three new factories to meet demand.",
    "A small village in the mountains has started producing all of its electricity from solar panels and "
    "a small hydroelectric plant. The project took four years and was paid for partly by the residents "
    "themselves. Energy bills have dropped by half, and the village now sells extra power to the "
    "national grid during the summer months.",
    "The local library will host a series of free workshops this autumn. Topics include basic computer "
    "skills, writing a CV, and introduction to photography. Each workshop lasts two hours and places are "
    "limited to fifteen people, so residents are asked to register in advance at the front desk or online.",
    "Scientists have discovered a new species of frog in the rainforest. The frog is only one centimetre "
    "long, making it one of the smallest known vertebrates. It lives among fallen leaves and is almost "
    "impossible to see. The team warns that deforestation threatens its habitat and calls for the area "
    "to be protected.",
    "The football club confirmed that its star striker will miss the rest of the season because of a knee "
    "injury suffered during training. The coach said the team would have to change its style of play and "
    "rely more on young players. The club is also considering signing a replacement before the transfer "
    "window closes at the end of the month.",
    "A new study suggests that walking for thirty minutes a day can lower the risk of heart disease by up "
    "to a third. The benefits were seen in people of all ages and did not depend on walking speed. Doctors "
    "say that small changes, such as taking the stairs or walking to the shops, can make a real difference.",
    "The museum reopened after a two-year renovation that added a new wing for modern art, a rooftop café "
    "and better access for wheelchair users. On the first weekend, more than ten thousand people visited. "
    "The director said the goal was to make the museum a place where families want to spend a whole day.",
    "Engineers have tested a prototype train that floats above the track using magnets. The train reached "
    "a speed of six hundred kilometres per hour during the test. Because there is no friction with the "
    "rails, the train is quiet and needs little maintenance, but building the special tracks is expensive.",
]
_SUMMARY_INSTRUCTIONS = [
    "Summarise the following text in one sentence:\n\n{p}",
    "Summarise the following text in three bullet points:\n\n{p}",
    "Write a short summary of this article:\n\n{p}",
    "{p}\n\nWhat is the main point of the text above? Answer briefly.",
    "Give a TL;DR of the following passage:\n\n{p}",
    "Read the text and write a headline for it:\n\n{p}",
]


def _math_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
        name, other = rng.sample(_NAMES, 2)
        item = rng.choice(_ITEMS)
        kind = i % 8
        if kind == 0:
            out.append(f"{name} has {a} {item}. {other} gives {name} {b} more, and then {name} gives away {c}. "
                       f"How many {item} does {name} have now? Explain step by step.")
        elif kind == 1:
            out.append(f"A shop sells {item} for {c} dollars each. {name} buys {b} of them and pays with a "
                       f"{100 * ((b * c) // 100 + 1)}-dollar note. How much change does {name} get?")
        elif kind == 2:
            out.append(f"Solve for x: {c}x + {a} = {a + c * b}. Show your work.")
        elif kind == 3:
            out.append(f"What is {a} multiplied by {b}, plus {c}?")
        elif kind == 4:
            out.append(f"A train travels at {a + 40} km/h for {c} hours. How far does it travel?")
        elif kind == 5:
            out.append(f"What is {c * 5} percent of {a * 10}? Explain how you calculate it.")
        elif kind == 6:
            out.append(f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?")
        else:
            out.append(f"{name} reads {c} pages a day. The book has {a * c + b} pages. How many days does "
                       f"{name} need to finish it?")
    return out


def builtin_prompts(seed: int = 0) -> list[tuple[str, str]]:
    """The project's own prompt sets as (category, text); 690 prompts, deterministic."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    out += [("chat", t.format(t=topic)) for topic in _CHAT_TOPICS for t in _CHAT_TEMPLATES[:5]]
    out += [("chat", rng.choice(_CHAT_TEMPLATES[5:]).format(t=topic)) for topic in _CHAT_TOPICS]
    out += [("chat", q) for q in _ADVICE]
    for task in _CODE_TASKS:
        langs = ["Python"] + rng.sample(_CODE_LANGS[1:], 2)
        out += [("code", f"Write a {lang} function that {task}.") for lang in langs]
    out += [("code", q) for q in _CODE_EXTRA]
    out += [("math", q) for q in _math_prompts(rng, 200)]
    for s in _SENTENCES:
        out += [("translation", f"Translate the following sentence into {lang}: {s}") for lang in _LANGS]
    out += [("translation", f"Translate this {lang} sentence into English: {s}") for lang, s in _FOREIGN]
    for p in _PASSAGES:
        out += [("summarisation", t.format(p=p)) for t in _SUMMARY_INSTRUCTIONS]
    return out
