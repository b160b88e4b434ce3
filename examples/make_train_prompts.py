"""Writes examples/train-prompts.jsonl: the prompts the default pair's drafters were trained on.

Templates crossed with topics give a few thousand varied requests in six scenarios (code, chat,
explain, list, rewrite, creative). The drafters learn from the *target's answers* to these, so the
prompts need variety more than polish. Seeded: `python examples/make_train_prompts.py` always
writes the same file. Prompts that appear in the bench or calibration files are left out.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 0
PER_SCENARIO = 400

LANGUAGES = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby", "Bash", "SQL", "Kotlin"]
TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list",
    "finds the largest element of an array", "computes the factorial of a number", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "sums the digits of an integer", "flattens a nested list",
    "reads a file and counts its lines", "sorts a list of words by length", "returns the most common word in a text",
    "computes the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "converts a decimal number to binary", "finds the second smallest number in a list", "capitalises every word in a sentence",
    "validates an email address", "computes the average of a list of numbers", "splits a list into chunks of size n",
    "rotates an array by k positions", "counts how often each character occurs", "implements binary search",
    "implements bubble sort", "parses a date string into year, month and day", "returns the transpose of a matrix",
    "checks whether brackets in a string are balanced", "generates all subsets of a set", "finds the longest word in a sentence",
    "implements a stack with push and pop", "computes the distance between two points", "removes whitespace from a string",
    "returns the intersection of two lists", "checks whether a year is a leap year", "computes compound interest",
    "implements a simple queue", "counts the words in a text",
]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Show me how to write a {lang} program that {task}.",
    "Implement a function in {lang} that {task}, with a short docstring or comment.",
    "Write {lang} code that {task}, and explain it in two sentences.",
    "Give me a {lang} snippet that {task}.",
    "How would you write a function that {task} in {lang}?",
]
CODE_EDITS = [
    "Add type hints to this Python function and return the code:\n```python\ndef {name}(a, b):\n    return a {op} b\n```",
    "Rename the variable `x` to `{word}` in this code and return it:\n```python\nx = {num}\nprint(x {op} 2)\n```",
    "Explain what this code does:\n```python\nresult = [n {op} 2 for n in range({num}) if n % 2 == 0]\n```",
    "Convert this Python loop into a list comprehension:\n```python\nout = []\nfor n in range({num}):\n    out.append(n {op} 3)\n```",
    "Find the bug in this function:\n```python\ndef {name}(items):\n    total = 0\n    for item in items:\n        total = item\n    return total\n```",
    "Write a unit test for this function:\n```python\ndef {name}(a, b):\n    return a {op} b\n```",
]
NAMES = ["add", "combine", "apply", "compute", "mix", "join_values", "calc", "step"]
OPS = ["+", "-", "*", "//", "%"]
WORDS = ["count", "total", "value", "size", "speed", "limit", "score", "index"]

CHAT_TEMPLATES = [
    "How can I {goal}?", "What is the best way to {goal}?", "Any tips to {goal}?", "I want to {goal}. Where do I start?",
    "Can you help me {goal}?", "What should I know before I {goal}?", "Is it hard to {goal}?",
    "My friend asked me how to {goal}. What should I tell them?",
]
GOALS = [
    "sleep better", "learn a new language", "save money each month", "start running", "cook healthy meals on a budget",
    "stay focused while studying", "make new friends in a new city", "prepare for a job interview", "keep a plant alive",
    "learn to play the guitar", "organise my week", "write a good cover letter", "reduce stress at work",
    "start a vegetable garden", "learn to program", "travel with only a backpack", "improve my handwriting",
    "read more books", "drink more water", "get better at chess", "plan a birthday party", "train a puppy",
    "ask for a raise", "keep my apartment tidy", "learn to swim as an adult", "be more productive in the morning",
    "speak in public with confidence", "choose a laptop", "take better photos with my phone", "wake up earlier",
    "stop procrastinating", "start a small business", "bake bread at home", "learn to draw", "memorise vocabulary",
    "keep in touch with old friends", "choose a good book", "build a habit", "eat less sugar", "manage my time",
]
SMALL_TALK = [
    "Hi! How are you today?", "What's your favourite season and why?", "Tell me something interesting.",
    "What do you think about rainy days?", "Can you recommend a board game for four people?",
    "I'm bored. What could I do this afternoon?", "What's a good name for a cat?", "Do you like music?",
    "What would you take to a desert island?", "Say something nice to cheer me up.",
]

EXPLAIN_TEMPLATES = [
    "Explain {topic} in simple terms.", "What is {topic}?", "Explain {topic} to a ten-year-old.",
    "Give a short explanation of {topic}.", "How does {topic} work?", "Why is {topic} important?",
    "Describe {topic} in three sentences.", "What are the basics of {topic}?",
]
TOPICS = [
    "photosynthesis", "gravity", "the water cycle", "inflation", "machine learning", "a black hole", "DNA",
    "the internet", "electricity", "vaccines", "climate change", "supply and demand", "a neural network", "recursion",
    "the stock market", "evolution", "the immune system", "encryption", "a compiler", "volcanoes", "the moon's phases",
    "democracy", "compound interest", "a hash table", "the French Revolution", "plate tectonics", "the greenhouse effect",
    "how a car engine works", "blockchain", "the human heart", "rainbows", "sound waves", "an operating system",
    "probability", "the Pythagorean theorem", "antibiotics", "solar panels", "tides", "the scientific method", "caching",
    "version control", "a database index", "garbage collection", "the speed of light", "bees and pollination",
]

LIST_TEMPLATES = [
    "List {n} {thing}.", "Give me {n} {thing}.", "Name {n} {thing}, one per line.", "What are {n} {thing}?",
    "Make a numbered list of {n} {thing}.", "Write a bullet list of {n} {thing}.",
]
THINGS = [
    "fruits that are high in vitamin C", "programming languages", "countries in South America", "ways to save energy at home",
    "famous scientists", "healthy breakfast ideas", "tips for writing clean code", "animals that live in the ocean",
    "board games for families", "uses of a paperclip", "European capitals", "benefits of exercise", "things to pack for a hike",
    "common interview questions", "Python libraries for data science", "kitchen tools every cook needs",
    "ways to learn faster", "musical instruments", "planets in the solar system", "hobbies you can do at home",
    "reasons to learn history", "colours of the rainbow", "vegetables that grow quickly", "classic novels",
    "Linux commands for beginners", "git commands", "mammals that can fly or glide", "ideas for a rainy day",
    "ways to reduce plastic waste", "questions to ask a new friend", "sports played with a ball", "types of clouds",
    "things to do in a big city", "tips for a long flight", "HTTP status codes", "data structures",
]

REWRITE_TEMPLATES = [
    "Rewrite this sentence to sound more formal: \"{s}\"", "Make this sentence shorter: \"{s}\"",
    "Rewrite this in a friendly tone: \"{s}\"", "Fix the grammar of this sentence: \"{s}\"",
    "Paraphrase this sentence: \"{s}\"", "Summarise in a few words: \"{s}\"", "Translate this sentence into French: \"{s}\"",
    "Rewrite this sentence in the past tense: \"{s}\"", "Turn this into a question: \"{s}\"",
]
SENTENCES = [
    "hey can u send me the report by tomorrow", "The meeting has been moved to Thursday because the room is busy.",
    "i dont think this plan will work but lets try it anyway", "Our team is working hard to finish the project on time.",
    "The weather is nice so we go to the park after lunch.", "Please remember to turn off the lights when you leave.",
    "me and him was going to the store yesterday", "The new software update makes the app faster and easier to use.",
    "We need more people to help with the event next week.", "This restaurant serves the best pizza in town.",
    "the train was late again and everyone was angry", "She studies every evening because she wants to become a doctor.",
    "I am writing to ask about the job you posted last week.", "our sales went up a lot this year thanks to the new website",
    "The children played in the garden until it got dark.", "Can you explain why the results are different from last time?",
    "he dont like coffee but he drinks tea every morning", "The library will be closed on Monday for repairs.",
    "thanks for your help, it was really useful", "The package should arrive within three to five working days.",
    "We are sorry for the delay and thank you for your patience.", "the cat sleeped on the sofa all day long",
    "Learning a new skill takes time and practice.", "Your password must contain at least eight characters.",
    "The museum is free for students on Sundays.", "i will call you back later when im not busy",
]

CREATIVE_TEMPLATES = [
    "Write a short poem about {subject}.", "Write a haiku about {subject}.", "Tell a very short story about {subject}.",
    "Write a limerick about {subject}.", "Describe {subject} in a vivid paragraph.",
    "Write the opening line of a novel about {subject}.", "Write a short song verse about {subject}.",
    "Invent a fairy tale about {subject} in five sentences.",
]
SUBJECTS = [
    "the sea", "a lonely robot", "autumn leaves", "a cat who wants to fly", "the city at night", "a lost key",
    "the first day of school", "a dragon who is afraid of fire", "coffee", "the moon", "a rainy Monday", "an old lighthouse",
    "friendship", "a time traveller", "a tiny mouse in a big house", "the mountains", "a snowman in spring", "the stars",
    "a talking tree", "a forgotten letter", "a detective dog", "the last bus home", "a garden in winter", "a brave knight",
    "a wizard who lost his hat", "the desert", "a summer storm", "a paper boat", "an astronaut's dream", "the ocean floor",
]


def code(rng: random.Random) -> str:
    if rng.random() < 0.8:
        return rng.choice(CODE_TEMPLATES).format(lang=rng.choice(LANGUAGES), task=rng.choice(TASKS))
    return rng.choice(CODE_EDITS).format(name=rng.choice(NAMES), op=rng.choice(OPS), word=rng.choice(WORDS), num=rng.randint(5, 50))


def chat(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return rng.choice(SMALL_TALK)
    return rng.choice(CHAT_TEMPLATES).format(goal=rng.choice(GOALS))


GENERATORS = {
    "code": code,
    "chat": chat,
    "explain": lambda rng: rng.choice(EXPLAIN_TEMPLATES).format(topic=rng.choice(TOPICS)),
    "list": lambda rng: rng.choice(LIST_TEMPLATES).format(n=rng.randint(3, 10), thing=rng.choice(THINGS)),
    "rewrite": lambda rng: rng.choice(REWRITE_TEMPLATES).format(s=rng.choice(SENTENCES)),
    "creative": lambda rng: rng.choice(CREATIVE_TEMPLATES).format(subject=rng.choice(SUBJECTS)),
}


def main() -> None:
    rng = random.Random(SEED)
    taken = {json.loads(line)["prompt"] for name in ("../benchmarks/bench-prompts.jsonl", "calibration-prompts.jsonl",
                                                     "equivalence-prompts.jsonl")
             for line in (HERE / name).read_text().splitlines() if line.strip()}
    rows = []
    for scenario, make in GENERATORS.items():
        seen = set()
        for _ in range(50 * PER_SCENARIO):  # bounded: a small template space simply yields fewer prompts
            if len(seen) == PER_SCENARIO:
                break
            text = make(rng)
            if text not in seen and text not in taken:
                seen.add(text)
                rows.append({"id": f"{scenario}-{len(seen)}", "prompt": text, "scenario": scenario})
    (HERE / "train-prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {HERE / 'train-prompts.jsonl'}")


if __name__ == "__main__":
    main()
