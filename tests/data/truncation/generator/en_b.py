from dsl import C, T, TOOL

CONVOS = []

# 10 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-k8s-oomkilled-limits",
        lang="en",
        schema="openai.chat",
        system="You are an SRE assistant. You can run read-only kubectl commands with the kubectl tool.",
        turns=[
            T(
                "What's a good way to explain to my kids why we're not getting a dog yet?",
                "Be honest and concrete rather than just saying 'not now': explain that a dog needs walks twice a day, someone home for much of the day, and money for food and the vet, and that right now the family can't give it a good life. Then give them a path: 'When we move to a house with a garden, we'll talk about it again.' Letting them help with a neighbour's dog or volunteer at a shelter can channel the enthusiasm.",
            ),
            T(
                "Can you recommend a good mechanical keyboard for programming under $150?",
                "The Keychron K8 Pro or V3 are popular choices around $90-110: tenkeyless layout, hot-swappable switches and solid Mac and Windows support. If you like a compact layout, the Keychron Q2 or a Leopold FC660M are excellent. For switches, tactile ones like Brown or Boba U4T give feedback without the noise of clicky Blues, which your coworkers will appreciate on calls.",
            ),
            TOOL(
                "The payments-api pod in prod keeps restarting. Can you take a look?",
                [
                    (
                        "kubectl",
                        {"args": "describe pod payments-api-7d9f8b6c4-xk2lp -n payments"},
                        "Name:         payments-api-7d9f8b6c4-xk2lp\nNamespace:    payments\nContainers:\n  api:\n    Image:     registry.internal/payments-api:2.14.3\n    Limits:\n      cpu:     1\n      memory:  512Mi\n    Requests:\n      cpu:     250m\n      memory:  256Mi\n    State:          Running\n    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n    Restart Count:  14\nEvents:\n  Warning  BackOff  3m (x41 over 2h)  kubelet  Back-off restarting failed container api",
                    ),
                    (
                        "kubectl",
                        {"args": "top pod payments-api-7d9f8b6c4-xk2lp -n payments --containers"},
                        "POD                           NAME   CPU(cores)   MEMORY(bytes)\npayments-api-7d9f8b6c4-xk2lp  api    310m         498Mi",
                    ),
                ],
                "The container is being OOMKilled: last exit code 137, 14 restarts in the last couple of hours, with a memory limit of 512Mi and a request of only 256Mi. kubectl top shows it sitting at 498Mi right now, just under the limit, so it's running into the ceiling under normal load rather than on a rare spike. CPU looks healthy at 310m against a 1-core limit.",
            ),
            T(
                "How do I get rid of limescale on my shower head?",
                "Unscrew the shower head if you can and soak it in white vinegar for a few hours or overnight. If it doesn't come off, fill a plastic bag with vinegar, tie it around the head with a rubber band so the nozzles are submerged, and leave it for a couple of hours. Scrub the nozzles with an old toothbrush, poke any stubborn holes with a pin, and run hot water through it before using it again.",
            ),
            T(
                "What's a good way to practise mental math?",
                "Practise a few minutes daily with everyday numbers: add up grocery prices as you shop, calculate tips, or work out travel times. Learn a few tricks, like multiplying by 5 as 'times 10, halve it', or splitting 47 x 6 into 40 x 6 plus 7 x 6. Apps like Elevate or a simple flashcard drill help with speed. Work left to right, the way you'd say the number, instead of the right-to-left method from school.",
            ),
            T(
                "Can you summarize the pros and cons of a heat pump versus a gas furnace?",
                "A heat pump is very efficient, often delivering three units of heat per unit of electricity, provides cooling in summer too, and avoids burning gas at home. Downsides are a higher upfront cost and reduced efficiency in very cold climates unless you buy a cold-climate model. A gas furnace is cheaper to install and produces strong heat in deep cold, but it only heats, burns fossil fuel and depends on gas prices. Rebates can narrow the cost gap considerably.",
            ),
            T(
                "My partner and I keep arguing about chores. Is there a fair way to split them?",
                "Write down every recurring task, including invisible ones like planning meals, booking appointments and buying gifts, and estimate how long each takes per week. Then each of you marks the tasks you mind least and split by time, not by count. Give each task a clear owner rather than 'helping', which removes the need for reminders. Review it after a month, because a fair split on paper often needs adjusting.",
            ),
            T(
                "What's the difference between a crocodile and an alligator?",
                "The easiest tell is the snout: alligators have a wide, U-shaped snout, while crocodiles have a narrower, V-shaped one. When a crocodile's mouth is closed, its lower teeth are still visible, whereas an alligator's mostly disappear. Alligators live mainly in the southeastern US and China, usually in fresh water, while crocodiles are found across the tropics and tolerate salt water. Crocodiles also tend to be more aggressive.",
            ),
            T(
                "How do I write a cover letter when I'm moving from teaching into UX design?",
                "Lead with the bridge, not an apology: teaching is user research and iteration every day. Mention concrete transferable skills, such as observing how students actually use materials, redesigning lessons based on feedback, and explaining complex ideas simply. Then point to your UX work: a course, two portfolio case studies, or a volunteer project. Close by linking the company's product to a user problem you understand well from the classroom.",
            ),
            T(
                "What are good vegetarian sources of iron?",
                "Lentils, chickpeas, beans, tofu and tempeh are excellent, as are pumpkin seeds, quinoa, dark leafy greens like spinach and kale, and fortified breakfast cereals. Plant iron is absorbed less easily, so pair it with vitamin C, such as peppers, citrus or tomatoes, in the same meal. Avoid drinking tea or coffee with iron-rich meals since they reduce absorption. If you feel tired a lot, a blood test can check your levels.",
            ),
            T(
                "How can I stop procrastinating on my tax paperwork?",
                "Make the first step tiny and specific: 'Put all tax letters in one folder' rather than 'Do taxes'. Book a 45-minute appointment with yourself and treat it like a meeting, with coffee and music. Make a checklist of documents so progress feels visible. If it's genuinely overwhelming, booking an accountant creates a deadline and the relief is usually worth the fee.",
            ),
            T(
                "What are some easy Spanish tapas to make for a party?",
                "Patatas bravas with a smoky tomato sauce and aioli, pan con tomate, garlic prawns (gambas al ajillo), tortilla espanola cut into squares, chorizo cooked in red wine, and a plate of Manchego with quince paste and olives. Most can be made ahead, except the prawns, which take five minutes at the end. Serve with crusty bread and a chilled albarino or a jug of sangria.",
            ),
        ],
        dep=2,
        final="For that crash-looping pod in the payments namespace, what memory request and limit would you set based on the numbers we saw?",
        note="Needs the kubectl tool results: OOMKilled at 512Mi limit / 256Mi request, current usage 498Mi, CPU 310m.",
    )
)

# 11 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-gift-sister-pottery-class",
        lang="en",
        schema="openai.chat",
        system="You are a helpful assistant.",
        turns=[
            T(
                "How do I fix a squeaky door hinge?",
                "Close the door, tap the hinge pin up and out with a nail and hammer, wipe it clean, and coat it with a little petroleum jelly, white lithium grease or even a bar of soap. Tap it back in and swing the door a few times to spread the lubricant. WD-40 works short term but attracts dust and the squeak comes back. If the hinge is rusty, scrub the pin with steel wool first.",
            ),
            T(
                "What's the difference between HIIT and steady cardio for fat loss?",
                "Both work, because fat loss mainly comes from an overall calorie deficit. HIIT burns a lot in little time and improves fitness quickly, but it's demanding, so two or three sessions a week is plenty. Steady cardio like brisk walking or easy cycling burns fewer calories per minute, but you can do it daily, it's easy to recover from and it doesn't spike hunger as much. Most people do best with a mix they enjoy.",
            ),
            T(
                "Help me write a Slack message telling my team I'm taking Friday off.",
                "'Hi team, heads up that I'll be off this Friday (June 20). I'll wrap up the dashboard review by Thursday afternoon, and Priya has kindly agreed to cover any urgent requests. I'll be offline but will catch up on Monday morning. Thanks!' Mention who's covering and what you'll finish beforehand, and people won't have any questions.",
            ),
            T(
                "What's the best way to learn to draw faces?",
                "Start with proportions using the Loomis method: draw a circle for the cranium, slice the sides, and add a guideline for the eyes halfway down the head. Practise features separately, eyes, noses, mouths and ears, from photos for a week or two. Then do quick five-minute face sketches from reference daily, focusing on placement rather than detail. Copying master drawings also teaches you where to simplify.",
            ),
            T(
                "My sister turns 30 next month. She's into ceramics and hiking, and I want to spend under $150. Ideas?",
                "A few that cover both sides of her: a two-person wheel-throwing workshop you do together, which usually costs about $90-130 for a three-hour session at a local studio, with the pieces glazed and fired for pickup two weeks later; a set of handmade speckled mugs from a small potter, around $60; a packable down vest for hikes, around $120; or a national parks annual pass at $80 with a trail guide for her area. The workshop doubles as a shared experience, which people tend to remember.",
            ),
            T(
                "How long does cooked chicken last in the fridge?",
                "Three to four days, as long as it went into the fridge within two hours of cooking and your fridge is at 4 C or below. Store it in a shallow airtight container so it cools quickly. If you won't eat it in that time, freeze it, where it keeps well for two to four months. When reheating, make sure it's steaming hot all the way through, and don't reheat it more than once.",
            ),
            T(
                "What's a good Linux command to find the biggest files in a directory?",
                "For files and folders at the top level, use 'du -sh * | sort -h', which lists sizes in human-readable form with the largest last. To find the biggest individual files anywhere below, run 'find . -type f -exec du -h {} + | sort -rh | head -20'. If you have it installed, 'ncdu' gives an interactive browser of disk usage that's much quicker to explore.",
            ),
            T(
                "Any tips for staying focused when working from home?",
                "Set up a dedicated workspace, even just a corner, and get dressed as if you're going out; those cues help your brain switch modes. Plan your top three tasks each morning and work in 50-minute blocks with short breaks. Put your phone in another room during focus blocks and close email. A short walk at the start and end of the day acts as a fake commute and helps you switch off in the evening.",
            ),
            T(
                "Explain what a credit score is and what affects it.",
                "A credit score is a number, typically 300-850 in the US, that estimates how likely you are to repay borrowed money. The biggest factor is payment history, so paying on time matters most. Next is credit utilisation, the share of your available credit you use; keeping it under 30% helps. Length of credit history, the mix of credit types and recent applications make up the rest. Checking your own score doesn't hurt it.",
            ),
            T(
                "How do I choose a good watermelon at the store?",
                "Look for a creamy yellow field spot on the underside, which means it ripened on the vine; a white or pale green spot means it was picked early. It should feel heavy for its size, because that means it's juicy. Knock on it and listen for a deep, hollow sound rather than a dull thud. A dull rather than very shiny rind and brown webbing scars are also good signs.",
            ),
        ],
        dep=4,
        final="For my sister's present, you mentioned doing a class together; roughly what did you say that would cost, and how long does it take?",
        note="Needs the gift-ideas turn: two-person wheel-throwing workshop, about $90-130 for a three-hour session.",
    )
)

# 12 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-tax-home-office-simplified",
        lang="en",
        schema="anthropic.messages",
        system="You are a helpful assistant. You are not a licensed tax advisor; suggest professional help when the stakes are high.",
        turns=[
            T(
                "Can you give me a simple weeknight pasta using things most people have in the pantry?",
                "Make spaghetti aglio e olio: cook 200 g of spaghetti, and meanwhile gently fry four sliced garlic cloves in six tablespoons of olive oil with a pinch of chilli flakes until just golden. Toss in the drained pasta with a splash of pasta water to make it glossy, then add parsley if you have it and plenty of Parmesan. It takes 15 minutes. A can of tuna or some lemon zest turns it into something more substantial.",
            ),
            T(
                "I'm self-employed and work from a spare room at home. How does the home office deduction work in the US?",
                "If the space is used regularly and exclusively for your business, you can choose between two methods. The simplified method gives you $5 per square foot of office space, up to 300 square feet, so at most $1,500, with no need to track actual expenses. The regular method applies the office's share of your home's square footage to actual costs such as rent or mortgage interest, utilities, insurance and repairs, plus depreciation if you own. You claim it on Schedule C, using Form 8829 for the regular method.",
            ),
            T(
                "How do I keep my phone battery healthy in the long run?",
                "Avoid keeping it at 100% or letting it drop to 0% regularly; staying roughly between 20% and 80% is easiest on lithium-ion cells, and many phones now have an optimised or limited charging option that does this for you. Heat is the biggest enemy, so don't charge it under a pillow or leave it in a hot car. Using a decent charger is fine, and fast charging occasionally won't hurt it.",
            ),
            T(
                "What's the difference between weather and climate?",
                "Weather is what's happening in the atmosphere over hours or days in a specific place: today's rain, tomorrow's heat. Climate is the long-term pattern of weather in a region, usually averaged over 30 years or more. A neat way to remember it: climate is what you expect, weather is what you get. So one cold winter doesn't disprove a warming climate, just as one hot day doesn't prove it.",
            ),
            T(
                "Help me plan a five-day trip to Iceland in winter.",
                "Base yourself in Reykjavik for the first two days: explore the city, soak in the Sky Lagoon, and do the Golden Circle with Thingvellir, Geysir and Gullfoss. Days three and four, drive the south coast to Seljalandsfoss, Skogafoss, Reynisfjara black beach and Vik, staying overnight there, with a glacier hike on Solheimajokull. On day five, return via a northern lights tour if skies are clear. Rent a 4x4 and check road.is every morning.",
            ),
            T(
                "How can I tell if an egg is still fresh?",
                "Do the float test: gently place it in a bowl of water. A fresh egg sinks and lies flat on its side; a slightly older one stands upright on the bottom but is still fine to eat, ideally hard-boiled. If it floats, a large air pocket has formed and it's best thrown away. Cracking it onto a plate also helps: fresh eggs have a firm, domed yolk and thick white.",
            ),
            T(
                "What's a good exercise for improving posture at a desk?",
                "Chin tucks are the best quick one: sit tall and gently draw your chin straight back, making a double chin, hold for five seconds and repeat ten times. Add wall angels, sliding your arms up and down a wall while keeping your back flat against it, and band pull-aparts to strengthen the upper back. Set a reminder to stand and move every 30-45 minutes, since no posture is good for hours.",
            ),
            T(
                "How do I say no to extra work without hurting my career?",
                "Make it about priorities rather than refusal: 'I'd like to help. If I take this on, the Q3 report will slip by a week; which would you rather I focus on?' That shows you're committed and puts the trade-off in your manager's hands. Offer a smaller alternative when you can, like reviewing rather than owning. Saying yes to everything often leads to mediocre work on everything, which hurts more.",
            ),
            T(
                "Explain what Docker containers are in plain words.",
                "A container is a neat box that holds an application together with everything it needs to run: the right libraries, settings and tools. Because the box is self-contained, the app runs the same on your laptop, a test server or the cloud, without 'it works on my machine' problems. Containers share the host computer's operating system kernel, so they start in seconds and are much lighter than full virtual machines.",
            ),
            T(
                "What's the best way to clean white sneakers?",
                "Remove the laces and insoles and brush off loose dirt. Mix warm water with a little dish soap or laundry detergent and scrub the uppers with a soft brush or toothbrush; for the rubber soles, a magic eraser or baking soda paste works wonders. Wash laces separately in soapy water. Stuff the shoes with paper towels and let them air dry away from direct heat, which can yellow and warp them.",
            ),
            T(
                "Suggest a few good nature documentaries.",
                "'Planet Earth II' and 'Blue Planet II' are stunning and a great starting point. 'My Octopus Teacher' is a moving, intimate story about one diver's friendship with an octopus. 'Our Planet' on Netflix pairs gorgeous footage with a conservation message, and 'The Green Planet' looks at the surprisingly dramatic world of plants. For something shorter, 'Night on Earth' uses new camera technology to show animals after dark.",
            ),
            T(
                "How do I make my own vinaigrette?",
                "The basic ratio is three parts oil to one part acid. Whisk a tablespoon of vinegar or lemon juice with half a teaspoon of Dijon mustard, a pinch of salt and a little honey, then slowly whisk in three tablespoons of olive oil until it emulsifies. Shaking it all in a small jar works just as well. Add minced shallot, garlic or fresh herbs to change it up. It keeps about a week in the fridge.",
            ),
            T(
                "What's a polite way to ask my neighbours to keep the noise down after 10 pm?",
                "Talk to them face to face at a calm time, not in the middle of the noise, and keep it friendly: 'Hi, I'm in 3B. I start work early, and I can hear music quite clearly late in the evening. Would you mind keeping it lower after about ten?' Most people simply don't realise how much sound carries. A short handwritten note works if you can't catch them in person.",
            ),
            T(
                "How do I start learning chess as an adult?",
                "Learn the rules and basic checkmates first, like king and queen versus king, then focus on tactics, since most games at lower levels are decided by forks, pins and hanging pieces. Solve 10-15 tactics puzzles a day on Lichess or Chess.com and play slower games, 15+10 or longer, so you have time to think. After each game, review your mistakes without an engine first. Learn just a couple of openings by their ideas.",
            ),
        ],
        dep=1,
        final="On the home office question from earlier: my spare room is 180 square feet. What would the simpler method give me?",
        note="Needs the home office deduction turn: simplified method is $5 per sq ft up to 300 sq ft, so 180 sq ft gives $900.",
    )
)

# 13 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-python-aiohttp-semaphore",
        lang="en",
        schema="openai.chat",
        system="You are a senior software engineer helping a colleague. Prefer short, concrete answers.",
        turns=[
            T(
                "What's a good way to stop biting my nails?",
                "Figure out your triggers first, usually boredom, stress or concentration, and give your hands something else to do then, like a stress ball or fidget ring. Bitter-tasting nail polish works well as a reminder. Keep nails short and filed so there are no rough edges to pick at. Some people quit one finger at a time, which feels more manageable than trying to stop everything at once.",
            ),
            T(
                "Can you plan a treasure hunt for a kid's birthday in a small apartment?",
                "Write eight to ten rhyming clues, each leading to a hiding spot: under the sofa cushion, inside a boot, in the fridge door, behind the bathroom mirror, in the washing machine drum. Split the kids into two teams with different coloured clues so they don't crowd one spot. Hide a small prize at each stop and a bigger 'treasure' at the end, such as the party bags. Keep it to 20-25 minutes.",
            ),
            T(
                "What's the etiquette for tipping in Japan?",
                "Don't tip. In Japan good service is considered part of the job, and leaving money can cause confusion; staff may even chase after you to return it. This applies to restaurants, taxis, hotels and hairdressers. The main exception is a ryokan, where some guests give the room attendant an envelope with a small amount, but even that is optional. A sincere 'gochisousama deshita' after a meal is appreciated instead.",
            ),
            T(
                "I'm fetching about 2,000 URLs with aiohttp and asyncio.gather, but the site starts returning 429s. How do I limit it to 10 requests at a time?",
                "Wrap each request in an asyncio.Semaphore. Create 'sem = asyncio.Semaphore(10)' once, then in your fetch coroutine put 'async with sem:' around the 'async with session.get(url) as resp:' block. You still gather all 2,000 tasks, but only ten are in flight at any moment. Reuse a single ClientSession for everything, and if you still see 429s, add a short 'await asyncio.sleep(0.1)' inside the semaphore block or honour the Retry-After header.",
            ),
            T(
                "How can I keep cut flowers fresh for longer?",
                "Trim the stems at an angle under running water, remove any leaves that would sit below the waterline, and use a very clean vase. Add the flower food sachet, or a teaspoon of sugar plus a few drops of bleach. Change the water every two days and re-trim the stems. Keep the vase away from direct sun, radiators and the fruit bowl, since ripening fruit releases ethylene that ages flowers quickly.",
            ),
            T(
                "What's a healthy breakfast that isn't oatmeal?",
                "Greek yoghurt with berries, walnuts and a drizzle of honey takes two minutes and is high in protein. Eggs scrambled with spinach on wholegrain toast keep you full until lunch. A smoothie with frozen fruit, a handful of spinach, peanut butter and milk is good if you eat on the go. Savoury options like cottage cheese with tomatoes or a bean and avocado wrap also work well.",
            ),
            T(
                "How do I negotiate a raise?",
                "Prepare evidence: a list of results you've delivered with numbers, plus market salary data for your role from sites like Levels.fyi or Glassdoor. Ask for a dedicated meeting rather than raising it in passing, name a specific figure at the upper end of your research, and then stop talking. If the answer is 'not now', ask what exactly you need to achieve and agree on a date to revisit it, and follow up in writing.",
            ),
            T(
                "What's the difference between an LLC and a sole proprietorship?",
                "A sole proprietorship is just you doing business: no registration beyond local licences, simple taxes, but no separation between your personal assets and business debts. An LLC is a separate legal entity that generally shields your personal assets if the business is sued or can't pay its debts. It costs a filing fee and some paperwork each year. By default a single-member LLC is still taxed like a sole proprietorship.",
            ),
            T(
                "How do I clean a front-loading washing machine that smells?",
                "Wipe the rubber door seal thoroughly, pulling back the folds where mould and lint collect, using a cloth with diluted vinegar or a mild bleach solution. Clean the detergent drawer and the drain filter at the bottom front, which often traps gunk. Then run an empty hot cycle with a washing machine cleaner or two cups of vinegar. Afterwards, leave the door and drawer ajar between washes so it can dry out.",
            ),
            T(
                "Can you recommend a beginner's telescope?",
                "A 6 or 8 inch Dobsonian reflector, such as the Sky-Watcher Traditional 8, is the best value for beginners: simple to set up, and big enough to show Saturn's rings, Jupiter's moons, and bright galaxies and nebulae. Avoid cheap 'high magnification' department store telescopes with wobbly tripods. Pair it with a star-hopping app like SkySafari and a red flashlight, and be patient while your eyes adapt to the dark.",
            ),
            T(
                "How do I write a good README for an open-source project?",
                "Open with one or two sentences on what the project does and who it's for, followed by a quick install and a minimal usage example that works if copied verbatim. Add a short features list, links to full docs, how to run the tests, and a contributing section. Include the licence and badges for CI status if you have them. A screenshot or GIF near the top helps a lot for tools with a visual output.",
            ),
        ],
        dep=3,
        final="In that rate-limited fetch helper you sketched for my crawler, where exactly would I put a per-request timeout so one hanging URL doesn't hold a slot forever?",
        note="Indirect ('crawler', 'rate-limited fetch helper'); needs the aiohttp + asyncio.Semaphore(10) structure to place the timeout inside the semaphore block.",
    )
)

# 14 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-car-civic-tire-pressure",
        lang="en",
        schema="openai.chat",
        system="You are a helpful assistant.",
        turns=[
            T(
                "What's a good way to organize a small closet?",
                "Start by taking everything out and keeping only what you've worn in the last year. Add a second hanging rod below the first for shirts and folded trousers, which nearly doubles the space. Use slim velvet hangers, put shelf dividers or bins on top for off-season items, and hang an over-the-door organiser for shoes or accessories. Group clothes by type and colour so you can see everything at a glance.",
            ),
            T(
                "What's the best way to learn a new language on my commute?",
                "Use audio-first courses like Pimsleur or Language Transfer, which are designed for listening without a screen and make you speak out loud. If you're on a train, add ten minutes of spaced-repetition flashcards in Anki or a similar app for vocabulary. Podcasts made for learners, such as 'Coffee Break' series, are great once you know the basics. Consistency matters more than session length, so daily commutes are ideal.",
            ),
            T(
                "How do I deal with a coworker who takes credit for my work?",
                "Start by making your contributions visible: send short written updates to your manager and share work in team channels rather than only with that coworker. In meetings, calmly add context, like 'Glad that's working; when I built the model I also found...'. If it continues, talk to the coworker privately and name the specific incident. If nothing changes, bring documented examples to your manager, focused on impact rather than blame.",
            ),
            T(
                "Does espresso have more caffeine than drip coffee?",
                "Per sip, yes: espresso is far more concentrated, roughly 60-65 mg of caffeine in a 30 ml shot. Per serving, usually not: a typical 240 ml mug of drip coffee has around 80-120 mg because it's much bigger. So a single espresso often has less caffeine than a regular cup of filter coffee, while a double shot is roughly comparable. The bean, roast and brew time also change the numbers.",
            ),
            T(
                "Can you suggest a beginner woodworking project?",
                "A simple wooden crate or a small bookshelf are great first projects because they teach measuring, square cuts, gluing and screwing without complex joinery. A cutting board from a single hardwood plank teaches sanding and finishing. You only need a saw, a drill, clamps, a square, sandpaper and wood glue. Buy pre-planed boards so they're straight, and practise cuts on scrap before the real pieces.",
            ),
            T(
                "What's a fast routine for cleaning a bathroom?",
                "Spray the toilet bowl, sink and shower with cleaner first and let it sit while you do other things. Clear the counters and wipe the mirror top to bottom with glass cleaner. Then scrub the sink and shower, wipe the toilet from the cleanest part to the dirtiest, and finish with the bowl. Empty the bin and mop the floor on your way out. Done weekly, it takes about 15 minutes.",
            ),
            T(
                "How do I know if I'm dehydrated?",
                "Common signs are thirst, dark yellow urine, urinating less often, a dry mouth, tiredness, headaches and feeling dizzy when you stand up. The easiest everyday check is urine colour: pale straw is good. Drink water steadily through the day and more in hot weather or when exercising. Seek medical help for severe symptoms like confusion, a very fast heartbeat or no urine for many hours.",
            ),
            T(
                "Write a limerick about a forgetful cat.",
                "There once was a cat named Lucille, / who forgot every single meal. / She'd eat, then she'd cry / with a sorrowful eye, / 'Has nobody fed me? Unreal!' Limericks work best read aloud with a bouncy rhythm, so if you change the name, pick one with the stress on the second syllable.",
            ),
            T(
                "What's a good way to save for a child's college in the US?",
                "A 529 plan is usually the best vehicle: money grows tax-free and withdrawals for qualified education expenses are tax-free too, and many states give a state income tax deduction for contributions. You can use it for college, some K-12 tuition and, under newer rules, roll limited amounts into a Roth IRA for the child. Set up automatic monthly contributions, even small ones, and let grandparents contribute directly.",
            ),
            T(
                "How do I stop Chrome from using so much memory?",
                "Close or bookmark tabs you don't need, and turn on Memory Saver in Settings > Performance, which puts inactive tabs to sleep. Check Chrome's own Task Manager (Shift+Esc on Windows) to spot greedy tabs or extensions, and remove extensions you don't use. Keep Chrome updated. If you routinely keep dozens of tabs open, a tab manager extension like OneTab can free a lot of memory.",
            ),
            T(
                "What should I plant in a shady garden bed?",
                "Hostas and ferns are classic for full shade and come in lots of leaf colours. For flowers, try astilbe, bleeding heart, foxgloves, hellebores and Japanese anemones. Heuchera adds colourful foliage, and ground covers like sweet woodruff or vinca fill gaps. Enrich the soil with compost, since shady beds under trees are often dry and root-filled, and water them well during their first summer.",
            ),
            T(
                "How do I fix a zipper that came off on one side?",
                "Cut a small notch in the tooth row right at the bottom of the side that came off, or use the very bottom where there are no teeth. Thread that side back into the slider, then gently pull the slider up so both sides engage. Once it zips, sew a few tight stitches at the bottom of the tape to act as a new stop, so it can't slide off again. Pliers can tighten a loose slider.",
            ),
            T(
                "What tire pressure should I run on my 2018 Honda Civic sedan? The sidewall says max 51 psi.",
                "Ignore the sidewall number for daily driving; that's the tyre's maximum safe pressure, not the recommended one. The placard on the driver's door jamb of a 2018 Civic sedan lists 32 psi front and rear for the standard 16-inch tyres, measured cold. Check it in the morning before driving, since pressure rises a few psi once tyres warm up. Checking monthly also helps fuel economy and tyre wear.",
            ),
            T(
                "How do I write a good bug report?",
                "Give it a specific title, like 'Checkout button does nothing on Safari 17 when cart has a discount code'. Include exact steps to reproduce, what you expected, and what actually happened, plus the version, browser or OS. Attach screenshots, logs or a short screen recording. Note whether it happens every time or intermittently. One bug per report keeps it easy to track and fix.",
            ),
            T(
                "What are healthy snacks for long drives?",
                "Choose things that are easy to eat one-handed and won't make a mess: almonds or trail mix, cheese sticks, baby carrots and sugar snap peas, apple slices, jerky and wholegrain crackers. Pack a cooler with water and a couple of sandwiches so you don't rely on petrol station food. Avoid heavy, greasy meals, which make you drowsy, and keep caffeine for when you really need it.",
            ),
            T(
                "Explain what a bear market is.",
                "A bear market is when a broad market index, like the S&P 500, falls 20% or more from its recent high, usually along with widespread pessimism. A drop of 10-20% is called a correction. Bear markets have historically lasted around a year on average, though it varies a lot, and they've always eventually been followed by recoveries. For long-term investors, continuing regular contributions during one means buying at lower prices.",
            ),
            T(
                "How do I freeze fresh herbs?",
                "For soft herbs like basil, parsley and coriander, chop them and pack them into an ice cube tray, then top up with olive oil or water and freeze; pop out a cube straight into sauces or soups. Hardy herbs such as rosemary, thyme and sage can be frozen whole on the stem in a freezer bag. Frozen herbs lose their texture, so use them in cooking rather than as a fresh garnish.",
            ),
            T(
                "Any tips for falling asleep on a plane?",
                "Pick a window seat so you can lean against the wall and won't be disturbed, and bring a neck pillow that supports your chin. An eye mask and noise-cancelling headphones or earplugs make a huge difference. Skip alcohol and caffeine, which fragment sleep, and dress in comfortable layers since cabins swing from warm to cold. On overnight flights, try to sleep at the time it would be night at your destination.",
            ),
            T(
                "What's the difference between a hurricane and a typhoon?",
                "Nothing except location: both are tropical cyclones with sustained winds of at least 119 km/h. In the Atlantic and northeast Pacific they're called hurricanes, in the northwest Pacific typhoons, and in the Indian Ocean and South Pacific simply cyclones. They form over warm ocean water and spin counter-clockwise in the Northern Hemisphere and clockwise in the Southern Hemisphere.",
            ),
            T(
                "How can I get my toddler to sleep in their own bed?",
                "Make the new bed inviting with their favourite blanket and a stuffed animal, and keep the same bedtime routine every night. Move gradually: sit by the bed until they fall asleep, then move your chair closer to the door over several nights. If they come to your bed at night, walk them back calmly and briefly each time. A sticker chart for staying in bed works well for many kids over two and a half.",
            ),
        ],
        dep=12,
        final="Before the road trip with four people and a full boot, should I bump up the tyre numbers you gave me for the Civic, and by how much?",
        note="Needs the Civic tyre turn: placard says 32 psi front/rear cold (not the 51 psi sidewall max); a full load may justify ~2-3 psi more.",
    )
)

# 15 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-calendar-dentist-slot",
        lang="en",
        schema="anthropic.messages",
        system="You are an executive assistant with access to the user's calendar (search_calendar) and a weather tool (get_weather). The user is in Chicago.",
        turns=[
            T(
                "Draft a short agenda for a 30-minute 1:1 with a new direct report.",
                "Here's a simple structure: 5 minutes of open check-in on how their first weeks are going; 10 minutes on their current priorities and anything blocking them; 10 minutes on how they like to work, for example communication preferences, feedback style and meeting cadence; and 5 minutes to agree on next steps and what you'll each bring next time. Share it a day ahead and invite them to add topics.",
            ),
            T(
                "What are healthy options at a steakhouse business dinner?",
                "Go for a smaller lean cut, such as a filet, sirloin or a grilled fish option, and ask for sauces on the side. Choose steamed or grilled vegetables, a salad, or a baked potato with toppings on the side instead of creamed spinach and fries. Sharing a couple of sides around the table is normal at steakhouses and helps with portions. Alternating each drink with water keeps you sharp for the conversation.",
            ),
            T(
                "Can you explain the difference between EBITDA and net income?",
                "Net income is the bottom line: revenue minus all expenses, including interest, taxes, depreciation and amortisation. EBITDA adds those four items back, so it shows earnings from core operations before financing decisions, tax rules and accounting for asset wear. Analysts use EBITDA to compare companies with different debt levels or asset bases, but it can flatter capital-heavy businesses because it ignores the cost of replacing equipment.",
            ),
            TOOL(
                "Will I need an umbrella in Chicago tomorrow?",
                [
                    (
                        "get_weather",
                        {"city": "Chicago", "date": "2025-06-06"},
                        '{"city": "Chicago", "date": "2025-06-06", "summary": "Thunderstorms in the late afternoon", "temp_c": {"min": 17, "max": 27}, "precip_prob": {"morning": 15, "afternoon": 70}}',
                    )
                ],
                "Yes, take one. Tomorrow starts dry, with only a 15% chance of rain in the morning, but thunderstorms are likely in the late afternoon at around 70%. It'll be warm, from 17 up to 27 degrees, so a compact umbrella and light layers are enough. If you have an outdoor plan, morning is the safer window.",
                pre="Let me pull tomorrow's forecast.",
            ),
            T(
                "How do I politely decline a LinkedIn connection from a recruiter I don't want to hear from?",
                "You don't need to reply at all; simply click 'Ignore' and they won't be notified. If you'd like to keep the door open for the future, accept and send a brief note: 'Thanks for reaching out. I'm not looking right now, but I'll keep you in mind.' You can also adjust your settings to signal you're not open to opportunities, which reduces these messages.",
            ),
            TOOL(
                "I need to fit in a 90-minute dentist appointment next Thursday afternoon. What's free?",
                [
                    (
                        "search_calendar",
                        {"date": "2025-06-12", "min_minutes": 45},
                        '{"date": "2025-06-12", "timezone": "America/Chicago", "free_slots": [{"start": "12:30", "end": "13:15"}, {"start": "14:00", "end": "16:00"}, {"start": "16:45", "end": "18:00"}]}',
                    )
                ],
                "Next Thursday afternoon you have three gaps: 12:30 to 1:15, which is too short; 2:00 to 4:00 pm; and 4:45 to 6:00 pm, which is 75 minutes and a bit tight. Only the 2:00 to 4:00 window fits a 90-minute appointment comfortably, with a little room for travel on one side. I can block it once you have a confirmed time from the clinic.",
                pre="Checking your calendar for next Thursday afternoon.",
            ),
            T(
                "Rewrite this to be more concise: 'We are currently in the process of reviewing the proposal and will get back to you in due course.'",
                "Shorter options: 'We're reviewing the proposal and will reply soon.' or, if you can commit to a date, 'We're reviewing the proposal and will respond by Friday.' The second is better because it removes uncertainty for the reader. Phrases like 'currently in the process of' and 'in due course' add length without adding meaning.",
            ),
            T(
                "What's a good book on negotiation?",
                "'Never Split the Difference' by Chris Voss, a former FBI hostage negotiator, is the most practical and readable, with techniques like labelling emotions and calibrated questions. 'Getting to Yes' by Fisher and Ury is the classic on principled, interest-based negotiation. If you negotiate deals regularly, 'Negotiation Genius' by Malhotra and Bazerman goes deeper on preparation and strategy.",
            ),
            T(
                "Any tips for beating jet lag on a flight from Chicago to London?",
                "Start shifting your sleep an hour earlier for two or three nights before you fly. Take an evening flight, set your watch to London time on boarding, eat a light meal and try to sleep for most of the flight. When you land in the morning, get outdoors in daylight and stay awake until at least 9 pm local time, with a short nap of under 30 minutes if you must. Avoid alcohol on the plane.",
            ),
            T(
                "How do I actually stick with using a standing desk?",
                "Don't try to stand all day; alternate about every 30-60 minutes, and set a recurring reminder or tie it to routines like standing for every call. Start with short standing periods and build up. An anti-fatigue mat and supportive shoes make standing much more comfortable. Set the desk at elbow height so your shoulders stay relaxed, and raise the monitor to eye level in both positions.",
            ),
            T(
                "What should I say in a toast at a colleague's farewell lunch?",
                "Keep it under two minutes. Start with a quick memory that shows who they are, like their first day or a project that went sideways and how they handled it. Say what the team will miss, specifically: their calm in crises, their terrible puns, their spreadsheet magic. Then wish them well in the new role and raise a glass. Light humour is great, but avoid inside jokes that exclude half the room.",
            ),
        ],
        dep=5,
        final="The dental office can do 2:15 or 4:45 that day. Which one actually fits around what we found in my calendar?",
        note="Needs the search_calendar result for Thursday: free 14:00-16:00 and 16:45-18:00; a 90-min slot at 2:15 fits, 4:45 would run past 18:00.",
    )
)

# 16 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-garden-tomato-blossom-end-rot",
        lang="en",
        schema="openai.chat",
        system="You are a friendly assistant who gives practical advice.",
        turns=[
            T(
                "How do I reset my router when the internet keeps dropping?",
                "First try a simple power cycle: unplug the router and modem for 30 seconds, plug the modem back in, wait until its lights are stable, then plug in the router. If drops continue, log into the router's admin page and check for a firmware update, and try changing the Wi-Fi channel to avoid interference from neighbours. A factory reset, done by holding the reset button for about ten seconds, is the last resort because it wipes your settings.",
            ),
            T(
                "Explain the difference between 'its' and 'it's'.",
                "'It's' is always short for 'it is' or 'it has': 'It's raining' or 'It's been a long day'. 'Its' is the possessive form, like 'his' or 'her': 'The dog wagged its tail.' A quick test is to replace the word with 'it is'; if the sentence still makes sense, use the apostrophe. Possessive pronouns never take apostrophes, which is what trips people up.",
            ),
            T(
                "What's the best way to pack carry-on only for a week?",
                "Lay out everything, then take away a third. Stick to a colour palette so every top goes with every bottom: roughly four tops, two bottoms, one layer and one pair of extra shoes, wearing the bulkiest items on the plane. Roll soft clothes and use packing cubes to compress them. Bring travel-size toiletries in a clear bag and plan to do one quick sink wash mid-week.",
            ),
            T(
                "How do I make a good French omelette?",
                "Beat three eggs with a pinch of salt until completely smooth. Melt a knob of butter in a non-stick pan over medium-low heat, add the eggs and stir constantly with a spatula while shaking the pan, so you get small, soft curds. When it's mostly set but still a little wet on top, stop stirring, smooth it out, and roll it onto the plate in thirds. It should be pale, with no browning, and creamy inside.",
            ),
            T(
                "What are good exercises for knee pain when climbing stairs?",
                "Pain on stairs often comes from weak hips and thighs. Try straight-leg raises, clamshells with a band, glute bridges, wall sits held for 20-30 seconds, and step-ups on a low step, slowly lowering yourself down. Do them three times a week. Keep movements pain-free and progress gradually. If the knee is swollen, locks or gives way, see a physiotherapist or doctor before starting.",
            ),
            T(
                "How do I start investing with just $100 a month?",
                "Open a brokerage account or a Roth IRA with a low-cost provider that has no minimums and allows fractional shares. Set up an automatic $100 monthly transfer into a broad, low-fee index fund, such as a total market or S&P 500 fund. Don't try to time the market; consistency matters most. Make sure you have a small emergency fund and no high-interest credit card debt first.",
            ),
            T(
                "Can you recommend board books for a one-year-old?",
                "Some favourites: 'Brown Bear, Brown Bear, What Do You See?', 'Dear Zoo' with its lift-the-flaps, 'Where's Spot?', 'Goodnight Moon', 'The Very Hungry Caterpillar', and 'That's Not My...' touch-and-feel books. At this age, bright pictures, repetitive text and things to touch or lift matter more than story. Reading the same few books over and over is exactly what they need.",
            ),
            T(
                "My tomato plants have fruit with black, leathery patches on the bottom. The leaves look fine. What's wrong?",
                "That's blossom end rot. It's caused by a calcium shortage in the developing fruit, but usually not because the soil lacks calcium; uneven watering stops the plant from moving calcium to the fruit. Water deeply and consistently, about 2-3 cm a week, mulch around the base to keep moisture steady, and avoid heavy nitrogen fertiliser. Pick off affected fruit; new fruit should come in clean within a couple of weeks once watering evens out.",
            ),
            T(
                "How do I write a formal complaint to an airline about lost luggage?",
                "Include your name, booking reference, flight number and date, and the file reference from the baggage desk. Describe the bag and its contents, state how long it has been missing, and list the expenses you've had, with receipts attached. Say clearly what you want: delivery of the bag, reimbursement, or compensation under the Montreal Convention. Keep the tone firm but polite, and set a reasonable deadline for their response.",
            ),
            T(
                "What's the difference between a hybrid and a plug-in hybrid car?",
                "A regular hybrid charges its small battery itself, through braking and the petrol engine, and uses the electric motor to help at low speeds, so you never plug it in. A plug-in hybrid has a bigger battery that you charge from a socket, giving roughly 40-80 km of pure electric driving before the petrol engine kicks in. Plug-ins make sense if most of your trips are short and you can charge at home.",
            ),
            T(
                "How do I teach a teenager to drive a manual car?",
                "Start in an empty car park. Teach the clutch alone first: with the engine running, slowly release the clutch in first gear until the car creeps forward, without touching the accelerator. Practise that until stalling stops, then add gentle throttle. Move on to shifting into second and stopping smoothly. Only go on quiet roads once they can start reliably, and leave hill starts until last.",
            ),
            T(
                "What's a simple way to start meditating?",
                "Sit comfortably, set a timer for five minutes, and focus on the sensation of breathing at your nostrils or belly. When your mind wanders, which it will constantly, notice it without judgement and gently come back to the breath; that returning is the exercise. Do it at the same time every day. Apps like Insight Timer, Headspace or Waking Up have guided sessions if silence feels hard at first.",
            ),
            T(
                "Which houseplants are safe to have around cats?",
                "Safe choices include spider plants, Boston ferns, calatheas, parlour palms, peperomia, African violets and most orchids. Avoid lilies entirely, as even pollen can cause kidney failure in cats, plus pothos, philodendron, snake plants, aloe and dieffenbachia, which are irritating or toxic. The ASPCA website has a searchable list if you're unsure about a specific plant.",
            ),
        ],
        dep=7,
        final="About the dark, leathery bottoms on my garden fruit: would crushing eggshells into the soil fix it quickly, or is that the wrong approach given what you said causes it?",
        note="Indirect reference to blossom end rot on tomatoes; needs that turn's explanation (uneven watering, not lack of soil calcium).",
    )
)

# 17 --------------------------------------------------------------------------
CONVOS.append(
    C(
        id="en-wedding-best-man-toast",
        lang="en",
        schema="anthropic.messages",
        blocks=True,
        system="You are a warm, witty personal assistant. You can search the web and translate text when useful.",
        turns=[
            T(
                "What's the best way to clean a laptop keyboard?",
                "Shut the laptop down and unplug it. Tilt it upside down at an angle and gently tap it to shake out crumbs, then use short bursts of compressed air between the keys, holding the can upright. Wipe the keys with a microfibre cloth lightly dampened with isopropyl alcohol, which evaporates quickly, and use a cotton swab around the edges. Never spray liquid directly onto the keyboard.",
            ),
            T(
                "Can you suggest a weekly meal plan for a family of four on a tight budget?",
                "Monday: lentil bolognese with pasta. Tuesday: chicken thigh traybake with potatoes and carrots. Wednesday: bean and cheese quesadillas with salad. Thursday: egg fried rice with frozen veg. Friday: homemade pizza on flatbreads. Saturday: big pot of vegetable and chickpea curry, with leftovers for Sunday lunch. Buy staples like rice, oats, beans and frozen vegetables in bulk and plan leftovers into lunches.",
            ),
            T(
                "How do I know if my houseplant needs a bigger pot?",
                "Signs include roots growing out of the drainage holes or circling the surface, water running straight through without soaking in, soil drying out within a day or two, and growth slowing despite good care. Slide the plant out to check: if you see more roots than soil, it's time. Move up only one pot size, about 2-5 cm wider, and do it in spring or early summer when the plant is actively growing.",
            ),
            T(
                "What are the rules of pickleball in a nutshell?",
                "It's played on a badminton-sized court with paddles and a plastic ball, usually in doubles. You serve underhand and diagonally, and the ball must bounce once on each side before anyone volleys, which is the two-bounce rule. You can't volley while standing in the seven-foot zone near the net, called the kitchen. Only the serving side scores, and games usually go to 11, win by 2.",
            ),
            TOOL(
                "What's the current men's marathon world record?",
                [
                    (
                        "search_web",
                        {"query": "men's marathon world record time holder"},
                        "1. World Athletics: Men's marathon world record 2:00:35, Kelvin Kiptum (KEN), Chicago, 8 October 2023.\n2. Kiptum broke Eliud Kipchoge's previous record of 2:01:09 set in Berlin in 2022.",
                    )
                ],
                "The men's marathon world record is 2:00:35, set by Kelvin Kiptum of Kenya at the Chicago Marathon on 8 October 2023. He took 34 seconds off Eliud Kipchoge's previous record of 2:01:09 from Berlin in 2022. Kipchoge's famous sub-two-hour run in Vienna in 2019 doesn't count as a record because it used rotating pacers and other non-race conditions.",
                pre="I'll look that up.",
            ),
            T(
                "What's a good strategy to pay off three credit cards?",
                "List the cards with balances and interest rates. Pay the minimum on all of them, then throw every extra dollar at the card with the highest APR, which is the avalanche method and saves the most money. If you need quick wins to stay motivated, target the smallest balance first instead, the snowball method. Consider a 0% balance transfer card if your credit is good, and stop using the cards while you pay them down.",
            ),
            T(
                "How do I make cold brew iced tea?",
                "Put about two tablespoons of loose tea, or four to five tea bags, into a litre of cold water in a jug. Cover and refrigerate for six to twelve hours: shorter for green tea, longer for black or herbal. Strain or remove the bags. Cold brewing extracts fewer tannins, so the tea comes out smooth and never bitter. Add lemon slices, mint or a little honey syrup to taste.",
            ),
            T(
                "Explain what a blockchain is in a couple of sentences.",
                "A blockchain is a shared digital ledger copied across many computers, where new records are grouped into blocks and each block is cryptographically linked to the previous one. Because changing an old record would mean redoing all later blocks on most of the network's copies, the history is extremely hard to tamper with. That lets strangers agree on who owns what without a central bank or company keeping the books.",
            ),
            T(
                "How do I teach my kid to ride a bike without training wheels?",
                "Take the pedals off and lower the seat so both feet are flat on the ground, turning it into a balance bike. Let your child scoot and glide on a gentle grassy slope until they can coast with feet up for a few seconds. Then put the pedals back on and hold their upper back, not the handlebars, as they pedal, letting go for longer stretches. Most kids get it within a few sessions this way.",
            ),
            T(
                "When is the best time of year to visit Portugal?",
                "Spring, from April to early June, and early autumn, from September to October, are ideal: warm, sunny days, fewer crowds and lower prices than in summer. July and August are hot, especially in the Alentejo and Douro, and the Algarve beaches get very busy. Winter is mild in Lisbon and the Algarve but rainier in the north. For swimming, September is great because the sea is at its warmest.",
            ),
            T(
                "How do I get a stuck ring off a swollen finger?",
                "Raise your hand above your heart for a few minutes and hold it in cold water or wrap it with ice to reduce swelling. Then lubricate the finger generously with soap, oil or moisturiser and twist the ring gently while pulling. If that fails, try the string method: wind dental floss tightly from the fingertip towards the ring, slide the end under it, and unwind from the palm side. If the finger turns blue or numb, go to urgent care.",
            ),
            T(
                "What's a good podcast microphone under $100?",
                "The Samson Q2U and the Audio-Technica ATR2100x are excellent choices around $70-100: dynamic microphones with both USB and XLR outputs, so you can start plugged into your laptop and upgrade to an audio interface later. Dynamic mics reject room noise better than condenser mics, which matters in untreated rooms. Add a foam windscreen and a cheap boom arm so you can keep it close to your mouth.",
            ),
            T(
                "How do I write an apology email to a client for a missed deadline?",
                "Be prompt and direct: acknowledge the missed deadline in the first sentence without excuses, for example 'I'm sorry we didn't deliver the report on Tuesday as promised.' Briefly explain the cause only if it's helpful, then focus on the fix: a new, realistic date and what you're doing to make sure it's met. Offer something to ease the impact if appropriate, and thank them for their patience.",
            ),
            TOOL(
                "How do you say 'congratulations on your new home' in German? It's for a card.",
                [
                    (
                        "translate",
                        {"text": "Congratulations on your new home", "target": "de"},
                        '{"translation": "Herzlichen Glückwunsch zum neuen Zuhause", "detected_source": "en"}',
                    )
                ],
                "You can write 'Herzlichen Glückwunsch zum neuen Zuhause!' That's the natural phrasing for a card. If you'd like to add a warm line underneath, 'Wir wünschen euch viele glückliche Momente in euren neuen vier Wänden' means 'We wish you many happy moments in your new four walls', which is a common and friendly idiom. Use 'euch' for friends and 'Ihnen' if it's more formal.",
                pre="Let me get an accurate translation.",
            ),
            T(
                "I'm the best man at my brother Tom's wedding in three weeks. Can you draft an opening for the toast? He once got us lost for two days on a camping trip in the Cairngorms.",
                "Here's an opening: 'Good evening, everyone. For those who don't know me, I'm Dan, Tom's younger brother, and for twenty-eight years I've trusted him with a lot of things: my secrets, my car, and once, unwisely, the map on a camping trip in the Cairngorms. We were lost for two days. So when Tom told me he'd found the person he wanted to spend his life with, my first question was: are you sure you read the directions right?' Then turn to Sarah: 'Meeting Sarah, I realised that for once he navigated perfectly.'",
            ),
            T(
                "What's the difference between a will and a trust?",
                "A will says who gets your assets and who looks after minor children after you die, and it goes through probate, a public court process that can be slow. A living trust holds assets while you're alive and passes them directly to beneficiaries without probate, and it can also manage things if you become incapacitated. Trusts cost more to set up and you must retitle assets into them. Many people have both.",
            ),
            T(
                "How do I get rid of ants in the kitchen without poison?",
                "Find the trail and wipe it with a spray of equal parts white vinegar and water, which removes the scent trail they follow. Clean up crumbs and sticky spots and keep sugar, honey and pet food in sealed containers. Seal entry points around windows and skirting boards with caulk. Sprinkling cinnamon, coffee grounds or diatomaceous earth along entry points also discourages them.",
            ),
            T(
                "Any tips for a first-time half-day kayaking trip?",
                "Go with a guided tour or rent on calm, sheltered water like a lake or a slow river. Always wear the buoyancy aid, and dress for the water temperature, not the air: quick-dry layers, no cotton, and shoes that can get wet. Bring water, sunscreen, a hat and a dry bag for your phone. Paddle with your torso rather than your arms, and plan your route so you finish with the wind behind you.",
            ),
            T(
                "How do I estimate my daily calorie needs?",
                "Start with your basal metabolic rate using the Mifflin-St Jeor equation: for men, 10 x weight in kg + 6.25 x height in cm - 5 x age + 5; for women, subtract 161 instead of adding 5. Multiply by an activity factor, roughly 1.2 if sedentary, 1.55 if moderately active, and 1.725 if very active. Treat the result as a starting point and adjust based on how your weight changes over a few weeks.",
            ),
            T(
                "What's a good ten-minute morning routine?",
                "Drink a glass of water first thing, then spend two minutes opening the curtains and getting daylight. Do five minutes of movement: a few sun salutations, squats and push-ups. Use the last three minutes to write down your top three priorities for the day. Keeping your phone off until you've finished makes the biggest difference, since email and news hijack the morning quickly.",
            ),
            T(
                "How do I fix a toilet that keeps running?",
                "Take the tank lid off and look. If water is spilling into the overflow tube, the fill level is too high, so lower the float by adjusting the screw or clip on the fill valve. If the water level is fine but it keeps refilling, the flapper at the bottom is probably leaking; a new one costs a few dollars and clips on in minutes. Also check that the chain isn't too tight or caught under the flapper.",
            ),
            T(
                "Suggest a cocktail I can batch for 20 people.",
                "A big jug of French 75 punch works well: mix 500 ml gin, 250 ml fresh lemon juice and 200 ml simple syrup ahead of time and chill it. Just before guests arrive, pour it into a punch bowl over a large block of ice and top with three bottles of chilled sparkling wine. Garnish with lemon wheels. A large ice block melts much more slowly than cubes, so the punch stays strong.",
            ),
            T(
                "What's a simple way to explain machine learning to my grandma?",
                "You could say: instead of writing step-by-step instructions for a computer, we show it lots of examples and let it find the patterns itself. It's like learning to recognise ripe tomatoes by looking at thousands of them rather than reading a rule book. After enough examples, the computer can make good guesses about new cases it has never seen, like which emails are spam or what word comes next in a sentence.",
            ),
            T(
                "How do I stop my puppy from biting hands?",
                "Puppies bite to play and explore, so redirect rather than punish: keep a toy handy and offer it whenever teeth touch skin. If the biting continues, say 'ouch' calmly, stop playing and turn away for 20-30 seconds so the fun ends. Avoid rough hand games. Make sure the puppy gets enough sleep, often 18 hours a day, because overtired puppies bite much more. It usually improves by six months.",
            ),
        ],
        dep=14,
        final="Can you punch up the first couple of lines of the toast you wrote for my brother's wedding? Keep the bit about getting lost.",
        note="Needs the best-man toast draft (Dan, brother Tom, lost two days in the Cairngorms, 'read the directions' joke).",
    )
)
