"""Writes benchmarks/batch-jobs.jsonl: four batch jobs of ten records each, the shape of a user piping
a job through one `specdec generate --json` process (`specdec generate --json < batch-jobs.jsonl`).
Records are made up here; each job's answers share their form, not their content.

    python benchmarks/make_batch_jobs.py > benchmarks/batch-jobs.jsonl
"""

import json

PEOPLE = [("Maria Lopez", 34, "Madrid", "architect"), ("Kenji Sato", 51, "Osaka", "chef"),
          ("Amara Okafor", 27, "Lagos", "nurse"), ("Lars Nilsson", 45, "Uppsala", "carpenter"),
          ("Priya Nair", 39, "Kochi", "pilot"), ("Tom Becker", 62, "Bremen", "teacher"),
          ("Chloe Martin", 23, "Lyon", "student"), ("Omar Haddad", 30, "Amman", "engineer"),
          ("Sofia Rossi", 48, "Turin", "lawyer"), ("Diego Alvarez", 36, "Quito", "photographer")]
PRODUCTS = [("desk lamp", 24.99, "black", "metal"), ("water bottle", 12.5, "blue", "steel"),
            ("office chair", 149.0, "grey", "mesh"), ("backpack", 59.9, "green", "canvas"),
            ("coffee mug", 8.75, "white", "ceramic"), ("wall clock", 31.2, "red", "plastic"),
            ("notebook", 4.3, "yellow", "paper"), ("headphones", 89.0, "silver", "aluminium"),
            ("umbrella", 17.6, "navy", "nylon"), ("cutting board", 22.4, "brown", "bamboo")]
REVIEWS = ["The battery lasts two days and the screen is bright. I would buy it again.",
           "It broke after a week and support never answered my emails.",
           "Fine for the price, though the buttons feel cheap.",
           "Absolutely love it: fast, quiet and easy to set up.",
           "The instructions were confusing and one part was missing.",
           "Works as described. Nothing special, nothing wrong.",
           "Terrible smell out of the box and it scratches easily.",
           "Great value, my whole family uses it every day.",
           "Delivery was late but the product itself is excellent.",
           "Too heavy to carry around and the strap hurts."]
CITIES = [("Lisbon", "Portugal"), ("Krakow", "Poland"), ("Valencia", "Spain"), ("Ghent", "Belgium"),
          ("Porto", "Portugal"), ("Bergen", "Norway"), ("Graz", "Austria"), ("Bologna", "Italy"),
          ("Tartu", "Estonia"), ("Aarhus", "Denmark")]


def jobs():
    for i, (name, age, city, job) in enumerate(PEOPLE):
        yield {"id": f"extract-{i}", "scenario": "extract", "prompt":
               f"Extract the person's name, age, city and job from the text and answer with JSON only, "
               f'with the keys "name", "age", "city" and "job".\nText: {name} is a {age}-year-old {job} who lives in {city}.'}
    for i, (item, price, colour, material) in enumerate(PRODUCTS):
        yield {"id": f"sql-{i}", "scenario": "sql", "prompt":
               f"Write one SQL INSERT statement that adds this product to the table products(name, price, colour, "
               f"material). Answer with the SQL only.\nProduct: a {colour} {material} {item} costing {price} euros."}
    for i, review in enumerate(REVIEWS):
        yield {"id": f"review-{i}", "scenario": "review", "prompt":
               "Classify the sentiment of this review as positive, negative or neutral, then give a one-sentence "
               f"reason. Answer in the form:\nSentiment: <label>\nReason: <sentence>\nReview: {review}"}
    for i, (city, country) in enumerate(CITIES):
        yield {"id": f"card-{i}", "scenario": "card", "prompt":
               f"Write a short travel card for {city}, {country} in exactly this form:\nCity: <name>\n"
               "Country: <country>\nBest season: <season>\nMust see: <one sight>\nTip: <one sentence>"}


if __name__ == "__main__":
    for job in jobs():
        print(json.dumps(job))
